// Stand-in for the macOS SDK's <mach/mach.h> (see README.md): the types metal-cpp uses.
#pragma once

typedef int kern_return_t;
typedef unsigned int natural_t;
typedef natural_t mach_port_name_t;
typedef mach_port_name_t mach_port_t;
typedef mach_port_t task_t;
typedef mach_port_t task_id_token_t;

#define KERN_SUCCESS 0
