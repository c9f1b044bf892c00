// Validation at the public boundary: shapes, dtypes and descriptor values are checked
// here, before any work, with messages naming the op, the argument and both shapes.
#pragma once

#include <initializer_list>
#include <optional>
#include <string>
#include <utility>

#include "core/problem.hpp"
#include "rnncore/error.hpp"
#include "rnncore/ops.hpp"

namespace rnncore::detail {

class Checker {
 public:
  explicit Checker(const char* op) : op_(op) {}

  [[noreturn]] void value_error(const std::string& msg) const;
  [[noreturn]] void type_error(const std::string& msg) const;

  // The first checked array fixes the dtype; every later one must match it.
  void dtype(const char* name, const TensorView& v);
  void exact(const char* name, const TensorView& v, const Shape& expected,
             const char* meaning = nullptr) const;
  // dtype(name, v), then exact(name, v, expected, meaning).
  void array(const char* name, const TensorView& v, const Shape& expected, const char* meaning);
  void rank(const char* name, const TensorView& v, int64_t rank, const char* meaning) const;
  void activation(const char* field, Activation a) const;
  // Refuses a product of sizes (named factors) too large for 64-bit byte arithmetic.
  void sizes(const char* what,
             std::initializer_list<std::pair<const char*, int64_t>> factors) const;
  DType dtype_value() const { return dtype_; }

 private:
  const char* op_;
  const char* first_ = nullptr;
  DType dtype_ = DType::Float32;
};

Problem validate(const RNNInputs& in, const RNNDescriptor& d);
Problem validate(const LSTMInputs& in, const LSTMDescriptor& d);
Problem validate(const GRUInputs& in, const GRUDescriptor& d);
Problem validate(const RNNGradientInputs& in, const RNNDescriptor& d);
Problem validate(const LSTMGradientInputs& in, const LSTMDescriptor& d);
Problem validate(const GRUGradientInputs& in, const GRUDescriptor& d);

}  // namespace rnncore::detail
