// Exceptions thrown by rnncore. Messages start with the operation in brackets:
//   [gru] init_state must have shape (4, 32) but has (4, 16)
#pragma once

#include <stdexcept>
#include <string>

namespace rnncore {

class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// A bad value or shape (Python: ValueError).
class ValueError : public Error {
 public:
  using Error::Error;
};

// A bad dtype or a value of the wrong type (Python: TypeError).
class TypeError : public Error {
 public:
  using Error::Error;
};

// Memory that could not be allocated, or sizes past what memory can hold (Python:
// MemoryError); thrown by the operations with the operation and the array named.
class OutOfMemoryError : public Error {
 public:
  using Error::Error;
};

// A known device that this build or machine cannot run (Python: RuntimeError).
class DeviceError : public Error {
 public:
  using Error::Error;
};

}  // namespace rnncore
