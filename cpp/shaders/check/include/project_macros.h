// Included first when msl_source.py preprocesses a source as Metal sees it: the project's
// macros as the Metal compiler reads them, so that a file checked on its own (a test snippet)
// reads as one that includes common.h.
#include "metal_macros.h"
