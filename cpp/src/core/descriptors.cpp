#include "rnncore/descriptors.hpp"

namespace rnncore {

const char* activation_name(Activation a) {
  return is_valid(a) ? kActivations[static_cast<int32_t>(a)].name : "invalid";
}

bool is_valid(Activation a) {
  const auto v = static_cast<int32_t>(a);
  return v >= 0 && v < kActivationCount;
}

namespace {

template <class D>
bool same_fields(const D& a, const D& b) {
  for (const auto& f : DescriptorTraits<D>::fields)
    if (f.flag ? a.*f.flag != b.*f.flag : a.*f.activation != b.*f.activation) return false;
  return true;
}

}  // namespace

bool RNNDescriptor::operator==(const RNNDescriptor& o) const { return same_fields(*this, o); }
bool LSTMDescriptor::operator==(const LSTMDescriptor& o) const { return same_fields(*this, o); }
bool GRUDescriptor::operator==(const GRUDescriptor& o) const { return same_fields(*this, o); }

}  // namespace rnncore
