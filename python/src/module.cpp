// rnncore._core: the nanobind module. Arrays come in through nb::ndarray (buffer
// protocol or DLPack, read in place when C-contiguous), go out as numpy arrays that own
// rnncore's storage through a capsule (no copy). The GIL is released while computing.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <array>
#include <cctype>
#include <climits>
#include <cstdint>
#include <iterator>
#include <stdexcept>
#include <string>
#include <string_view>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "rnncore/rnncore.hpp"

namespace nb = nanobind;
using namespace nb::literals;

namespace rnncore::python {
namespace {

using Array = nb::ndarray<nb::ro, nb::c_contig, nb::device::cpu>;
using OptArray = std::optional<Array>;

// ---- arrays -------------------------------------------------------------------------

std::string dtype_text(const nb::dlpack::dtype& t) {
  const char* kind = "unknown";
  switch (static_cast<nb::dlpack::dtype_code>(t.code)) {
    case nb::dlpack::dtype_code::Int: kind = "int"; break;
    case nb::dlpack::dtype_code::UInt: kind = "uint"; break;
    case nb::dlpack::dtype_code::Float: kind = "float"; break;
    case nb::dlpack::dtype_code::Bfloat: kind = "bfloat"; break;
    case nb::dlpack::dtype_code::Complex: kind = "complex"; break;
    case nb::dlpack::dtype_code::Bool: return "bool";
    default: break;
  }
  return kind + std::to_string(t.bits);
}

const nb::dlpack::dtype kFloat16{static_cast<uint8_t>(nb::dlpack::dtype_code::Float), 16, 1};
const nb::dlpack::dtype kBFloat16{static_cast<uint8_t>(nb::dlpack::dtype_code::Bfloat), 16, 1};

TensorView view(const char* op, const char* name, const Array& a) {
  DType dt;
  if (a.dtype() == nb::dtype<float>())
    dt = DType::Float32;
  else if (a.dtype() == nb::dtype<double>())
    dt = DType::Float64;
  else if (a.dtype() == kFloat16)
    dt = DType::Float16;
  else if (a.dtype() == kBFloat16)
    dt = DType::BFloat16;
  else
    throw TypeError(std::string("[") + op + "] " + name +
                    " must be a float32, float64, float16 or bfloat16 array but has dtype " +
                    dtype_text(a.dtype()));
  Shape shape(a.ndim());
  for (size_t i = 0; i < a.ndim(); ++i) shape[i] = static_cast<int64_t>(a.shape(i));
  return TensorView(a.data(), std::move(shape), dt);
}

std::optional<TensorView> view(const char* op, const char* name, const OptArray& a) {
  if (!a) return std::nullopt;
  return view(op, name, *a);
}

// A Python string made once and kept for the process: attribute names and dictionary keys
// that a call looks up (h.attr("x") builds its string anew each time).
#define RNNCORE_INTERNED(text)                                                          \
  ([]() -> nb::handle {                                                                 \
    static const nb::handle s = nb::str(text).release(); /* immortal for the process */ \
    return s;                                                                           \
  }())

// numpy's dtype of ml_dtypes.bfloat16, looked up once (kept for the process). Until
// ml_dtypes is loaded no array can have it: without `load`, None until then.
nb::handle bfloat16_dtype(bool load) {
  static nb::handle dtype;
  if (!dtype.is_valid()) {
    if (!load &&
        !PyDict_GetItemWithError(PyImport_GetModuleDict(), RNNCORE_INTERNED("ml_dtypes").ptr()))
      return nb::none();
    dtype = nb::module_::import_("numpy")
                .attr("dtype")(nb::module_::import_("ml_dtypes").attr("bfloat16"))
                .release();
  }
  return dtype;
}

nb::object to_numpy(const Tensor& t) {
  auto* keep = new std::shared_ptr<void>(t.storage());
  nb::capsule owner(keep, [](void* p) noexcept { delete static_cast<std::shared_ptr<void>*>(p); });
  std::vector<size_t> shape(t.shape().begin(), t.shape().end());
  // numpy has no bfloat16: its bits go out as uint16 and are viewed as ml_dtypes.bfloat16.
  const bool bf16 = t.dtype() == DType::BFloat16;
  const nb::dlpack::dtype dt = t.dtype() == DType::Float32   ? nb::dtype<float>()
                               : t.dtype() == DType::Float64 ? nb::dtype<double>()
                               : bf16                        ? nb::dtype<uint16_t>()
                                                             : kFloat16;
  nb::ndarray<nb::numpy> arr(const_cast<void*>(t.data()), shape.size(), shape.data(), owner,
                             nullptr, dt);
  nb::object out = nb::cast(arr, nb::rv_policy::reference);
  if (bf16) out = out.attr(RNNCORE_INTERNED("view"))(bfloat16_dtype(true));
  return out;
}

nb::object to_numpy(const std::optional<Tensor>& t) { return t ? to_numpy(*t) : nb::none(); }

std::string text(nb::handle h) { return nb::str(h).c_str(); }
std::string type_name_of(nb::handle h) { return text(h.type().attr("__name__")); }
bool truth(nb::handle h) { return PyObject_IsTrue(h.ptr()) == 1; }

// A bound descriptor class ("GRUDescriptor"), for the hint that descriptors are keywords.
bool is_descriptor(nb::handle h) {
  return nb::isinstance<RNNDescriptor>(h) || nb::isinstance<LSTMDescriptor>(h) ||
         nb::isinstance<GRUDescriptor>(h);
}

// Why `h` could not be read as a C-contiguous CPU array, as the end of a message.
[[noreturn]] void refuse_array(const std::string& where, nb::handle h) {
  if (is_descriptor(h))
    throw TypeError(where + " must be an array but got " + type_name_of(h) +
                    "; the descriptor is keyword-only: descriptor=...");
  const bool array_like = nb::hasattr(h, "__dlpack__") || nb::hasattr(h, "__array_interface__") ||
                          PyObject_CheckBuffer(h.ptr());
  if (!array_like)
    throw TypeError(where + " must be an array (numpy, buffer protocol or DLPack) but got " +
                    type_name_of(h));
  std::string what = type_name_of(h);
  if (nb::hasattr(h, "shape") && nb::hasattr(h, "dtype"))
    what += " of shape " + text(h.attr("shape")) + " and dtype " + text(h.attr("dtype"));
  if (nb::hasattr(h, "device")) {
    const std::string dev = text(h.attr("device"));
    if (dev.rfind("cpu", 0) != 0)
      throw TypeError(where + " is a " + what + " on device " + dev +
                      "; rnncore reads arrays in CPU memory (copy it with .cpu())");
  }
  // The caster copies a strided view to C order; for one, what remains is that copy failing.
  bool strided = false;
  if (nb::hasattr(h, "flags") && nb::hasattr(h.attr("flags"), "c_contiguous"))
    strided = !truth(h.attr("flags").attr("c_contiguous"));
  else if (nb::hasattr(h, "is_contiguous"))
    strided = !truth(h.attr("is_contiguous")());
  if (strided && nb::hasattr(h, "nbytes"))
    throw OutOfMemoryError(where + " is a strided " + what + "; its C-contiguous copy of " +
                           text(h.attr("nbytes")) + " bytes could not be allocated");
  throw TypeError(where + " is a " + what + " that could not be read as a C-contiguous CPU array");
}

// Whether h is a numpy.ndarray (or a subclass).
bool is_numpy_array(nb::handle h) {
  static nb::handle ndarray = nb::object(nb::module_::import_("numpy").attr("ndarray")).release();
  return Py_TYPE(h.ptr()) == reinterpret_cast<PyTypeObject*>(ndarray.ptr()) ||
         PyObject_IsInstance(h.ptr(), ndarray.ptr()) == 1;
}

// Reads argument `name` of `op`: an array, or nothing for None. A required argument that
// is None gets `hint` after the message. The messages' strings are made only for them: a
// call's arguments are read in a few microseconds, and a string each was a tenth of that.
OptArray array_arg(const char* op, const char* name, nb::handle h, bool required,
                   const char* hint = nullptr) {
  auto where = [&] { return std::string("[") + op + "] " + name; };
  if (h.is_none()) {
    if (!required) return std::nullopt;
    throw TypeError(where() + " is required" + (hint ? std::string(": ") + hint : std::string()));
  }
  // A numpy array of ml_dtypes.bfloat16 exports neither a buffer nor DLPack: read its bits
  // (as uint16) in place and tag them bfloat16; the view keeps the array alive. Checked
  // first, by the dtype object: the caster's failed exports cost microseconds an array.
  if (nb::handle bf = bfloat16_dtype(false); !bf.is_none() && is_numpy_array(h)) {
    const nb::object dtype = nb::steal(PyObject_GetAttr(h.ptr(), RNNCORE_INTERNED("dtype").ptr()));
    if (!dtype.is_valid()) throw nb::python_error();
    if (dtype.is(bf) || dtype.equal(bf)) {
      // C order first (a strided view is copied, as the caster copies other arrays).
      static const nb::handle uint16 =
          nb::module_::import_("numpy").attr("dtype")("uint16").release();
      nb::object bits = h.attr(RNNCORE_INTERNED("view"))(uint16);
      if (!truth(bits.attr(RNNCORE_INTERNED("flags")).attr(RNNCORE_INTERNED("c_contiguous"))))
        bits = nb::module_::import_("numpy").attr("ascontiguousarray")(bits);
      nb::ndarray<nb::ro, nb::c_contig, nb::device::cpu, uint16_t> u;
      if (nb::try_cast(bits, u, false)) {
        std::vector<size_t> shape(u.ndim());
        for (size_t i = 0; i < u.ndim(); ++i) shape[i] = u.shape(i);
        return Array(u.data(), u.ndim(), shape.data(), bits, nullptr, kBFloat16);
      }
    }
  }
  // A tensor in an autograd graph would leave it silently (nanobind reads one through
  // torch.utils.dlpack): rnncore.torch keeps it. Not numpy's arrays, the usual arguments.
  if (!is_numpy_array(h) && nb::hasattr(h, "requires_grad") && truth(h.attr("requires_grad")))
    throw TypeError(where() + " requires grad: rnncore." + op +
                    " is not part of torch's autograd; use the rnncore.torch modules, or pass "
                    "tensor.detach()");
  Array a;
  if (nb::try_cast<Array>(h, a, true)) return a;
  refuse_array(where(), h);
}

// sequence_lengths: any one-dimensional array of integers (numpy, a list, a CPU tensor), as
// int64; its size and values are the op's to check against N and T.
std::optional<std::vector<int64_t>> lengths_arg(const char* op, nb::handle h) {
  if (h.is_none()) return std::nullopt;
  const std::string where = std::string("[") + op + "] sequence_lengths";
  nb::module_ np = nb::module_::import_("numpy");
  nb::object arr;
  try {
    arr = np.attr("asarray")(h);
  } catch (const nb::python_error&) {
    throw TypeError(where + " must be an array of integers but got " + type_name_of(h));
  }
  const std::string kind = text(arr.attr("dtype").attr("kind"));
  if (kind != "i" && kind != "u")
    throw TypeError(where + " must hold integers but has dtype " + text(arr.attr("dtype")) +
                    " (from " + type_name_of(h) + ")");
  if (nb::cast<int64_t>(arr.attr("ndim")) != 1)
    throw ValueError(where + " must have shape (N,) but has shape " + text(arr.attr("shape")));
  // uint64 values above int64's range would wrap: refuse them as too long.
  if (kind == "u" && nb::cast<int64_t>(arr.attr("size")) > 0 &&
      nb::int_(arr.attr("max")()) > nb::int_(INT64_MAX))
    throw ValueError(where + " holds " + text(arr.attr("max")()) + ", above any T");
  nb::object i64 = np.attr("ascontiguousarray")(arr, "dtype"_a = "int64");
  const auto v =
      nb::cast<nb::ndarray<const int64_t, nb::ndim<1>, nb::c_contig, nb::device::cpu>>(i64);
  return std::vector<int64_t>(v.data(), v.data() + v.shape(0));
}

// "'cpu', 'metal' and 'metal-emulated'": every name parse_device knows, found by walking
// the Device values after Auto for as long as device_name and parse_device agree.
std::string known_devices() {
  std::vector<std::string> names;
  for (int i = static_cast<int>(Device::Auto) + 1;; ++i) {
    const auto d = static_cast<Device>(i);
    const std::string name = device_name(d);
    try {
      if (parse_device(name) != d) break;
    } catch (const ValueError&) {
      break;
    }
    names.push_back("'" + name + "'");
  }
  std::string s;
  for (size_t i = 0; i < names.size(); ++i)
    s += (i == 0 ? "" : i + 1 == names.size() ? " and " : ", ") + names[i];
  return s;
}

Device device_arg(const char* op, nb::handle h) {
  if (h.is_none()) return Device::Auto;
  if (!nb::isinstance<nb::str>(h))
    throw TypeError(std::string("[") + op + "] device must be a str or None but got " +
                    type_name_of(h));
  const std::string name = nb::cast<std::string>(h);
  // None means the default device; an empty name is a mistake, not another spelling of it.
  if (name.empty())
    throw ValueError(std::string("[") + op + "] unknown device ''; known devices are " +
                     known_devices() + " (None for the default)");
  try {
    return parse_device(name);
  } catch (const ValueError& e) {
    const std::string msg = e.what();  // "[device] unknown device ..."
    throw ValueError(std::string("[") + op + "]" + msg.substr(msg.find(']') + 1));
  }
}

// The descriptor argument: None means the defaults for a forward op and is refused for a
// gradient op (the defaults would give the gradients of another operation).
template <class D>
D descriptor_arg(const char* op, nb::handle h, bool required) {
  const char* cls = DescriptorTraits<D>::name;
  if (h.is_none()) {
    if (!required) return D{};
    throw TypeError(std::string("[") + op + "] descriptor is required: pass the " + cls +
                    " of the forward run");
  }
  if (!nb::isinstance<D>(h))
    throw TypeError(std::string("[") + op + "] descriptor must be an rnncore." + cls + " but got " +
                    type_name_of(h));
  return nb::cast<D>(h);
}

// ---- descriptors ----------------------------------------------------------------------
// Everything here walks DescriptorTraits<D>::fields and kActivations (descriptors.hpp):
// a new field or activation needs nothing in this file.

template <class D>
const auto& fields() {
  return DescriptorTraits<D>::fields;
}

// "0..4", for messages.
std::string activation_range() { return "0.." + std::to_string(kActivationCount - 1); }

// The Python member name: "HARD_SIGMOID" for "hard_sigmoid".
std::string member_name(Activation a) {
  if (!is_valid(a)) return "?";
  std::string s = activation_name(a);
  for (char& ch : s) ch = static_cast<char>(std::toupper(static_cast<unsigned char>(ch)));
  return s;
}

bool is_numpy_bool(nb::handle v) {
  nb::handle tp = v.type();
  if (!nb::hasattr(tp, "__module__")) return false;
  const std::string mod = nb::cast<std::string>(nb::str(tp.attr("__module__")));
  const std::string name = nb::cast<std::string>(nb::type_name(tp));
  return mod == "numpy" &&
         (name == "bool" || name == "bool_" || name == "numpy.bool" || name == "numpy.bool_");
}

template <class D>
void set_field(D& d, const Field<D>& f, nb::handle v) {
  const std::string where = std::string(DescriptorTraits<D>::name) + "." + f.name;
  if (f.flag) {
    // bool or numpy.bool_; ints are refused so that a misplaced activation is caught.
    if (PyBool_Check(v.ptr())) {
      d.*f.flag = v.ptr() == Py_True;
      return;
    }
    if (is_numpy_bool(v)) {
      d.*f.flag = nb::cast<bool>(v.attr("__bool__")());
      return;
    }
    throw TypeError(where + " must be a bool but got " +
                    nb::cast<std::string>(nb::type_name(v.type())));
  }
  if (nb::isinstance<Activation>(v)) {
    d.*f.activation = nb::cast<Activation>(v);
    return;
  }
  if (!PyBool_Check(v.ptr()) && PyIndex_Check(v.ptr())) {
    // PyNumber_Index returns a new reference: steal it so it is released.
    nb::object index = nb::steal(PyNumber_Index(v.ptr()));
    if (!index.is_valid()) throw nb::python_error();
    int overflow = 0;
    const long long x = PyLong_AsLongLongAndOverflow(index.ptr(), &overflow);
    if (overflow || x < 0 || x >= kActivationCount)
      throw ValueError(where + " must be an Activation (" + activation_range() + ") but got " +
                       text(index));
    d.*f.activation = static_cast<Activation>(x);
    return;
  }
  throw TypeError(where + " must be an rnncore.Activation or an int in " + activation_range() +
                  " but got " + nb::cast<std::string>(nb::type_name(v.type())));
}

template <class D>
std::string signature() {
  std::string s = "def __init__(self, *";
  const D def{};
  for (const auto& f : fields<D>()) {
    s += std::string(", ") + f.name;
    if (f.flag)
      s += std::string(": bool = ") + (def.*f.flag ? "True" : "False");
    else
      // Stub convention for a non-literal default; the docstring names the value.
      s += ": Activation | int = ...";
  }
  return s + ") -> None";
}

template <class D>
std::string repr_of(const D& d) {
  std::string s = std::string(DescriptorTraits<D>::name) + "(";
  bool first = true;
  for (const auto& f : fields<D>()) {
    if (!first) s += ", ";
    first = false;
    s += std::string(f.name) + "=";
    s += f.flag ? (d.*f.flag ? "True" : "False") : "Activation." + member_name(d.*f.activation);
  }
  return s + ")";
}

template <class D>
void bind_descriptor(nb::module_& m, const char* doc) {
  const char* cls = DescriptorTraits<D>::name;
  static const std::string sig = signature<D>();
  static const std::string full_doc =
      std::string(doc) + "\n\nMPSGraph's defaults: " + repr_of(D{}) + ".";
  nb::class_<D> c(m, cls, full_doc.c_str());
  c.def(
      "__init__",
      [cls](D* self, nb::args args, nb::kwargs kw) {
        if (args.size() != 0)
          throw TypeError(std::string(cls) + "() takes keyword arguments only but got " +
                          std::to_string(args.size()) + " positional");
        new (self) D();
        for (auto [k, v] : kw) {
          const std::string key = nb::cast<std::string>(k);
          bool found = false;
          for (const auto& f : fields<D>())
            if (key == f.name) {
              set_field(*self, f, v);
              found = true;
            }
          if (!found)
            throw TypeError(std::string(cls) + "() got an unexpected keyword argument '" + key +
                            "'");
        }
      },
      nb::sig(sig.c_str()));
  for (const auto& f : fields<D>()) {
    static std::vector<std::string> setter_sigs;  // nanobind keeps the pointer
    setter_sigs.push_back(std::string("def ") + f.name +
                          "(self, arg: " + (f.flag ? "bool" : "Activation | int") + ", /) -> None");
    auto set = [f](D& d, nb::handle v) { set_field(d, f, v); };
    if (f.flag)
      c.def_prop_rw(
          f.name, [f](const D& d) { return d.*f.flag; }, set, nb::for_getter(f.doc),
          nb::for_setter(nb::sig(setter_sigs.back().c_str())));
    else
      c.def_prop_rw(
          f.name, [f](const D& d) { return d.*f.activation; }, set, nb::for_getter(f.doc),
          nb::for_setter(nb::sig(setter_sigs.back().c_str())));
  }
  c.def(
      "__eq__",
      [](const D& a, nb::object b) { return nb::isinstance<D>(b) && a == nb::cast<const D&>(b); },
      "other"_a.none());
  c.def(
      "__ne__",
      [](const D& a, nb::object b) {
        return !(nb::isinstance<D>(b) && a == nb::cast<const D&>(b));
      },
      "other"_a.none());
  c.attr("__hash__") = nb::none();  // mutable
  // The field names in order (as namedtuple's _fields): Python code reads them from here.
  nb::list names;
  for (const auto& f : fields<D>()) names.append(f.name);
  c.attr("_fields") = nb::tuple(names);
  c.def("__repr__", [](const D& d) { return repr_of(d); });
  c.def("__copy__", [](const D& d) { return D(d); });
  c.def(
      "__deepcopy__", [](const D& d, nb::handle) { return D(d); }, "memo"_a);
  c.def("__getstate__", [](const D& d) {
    nb::list state;
    for (const auto& f : fields<D>())
      if (f.flag)
        state.append(d.*f.flag);
      else
        state.append(static_cast<int>(d.*f.activation));
    return nb::tuple(state);
  });
  c.def("__setstate__", [cls](D& d, nb::handle h) {
    const size_t n = std::size(fields<D>());
    if (!nb::isinstance<nb::tuple>(h))
      throw TypeError(std::string(cls) + ".__setstate__ takes a tuple of " + std::to_string(n) +
                      " fields but got " + type_name_of(h));
    const nb::tuple state = nb::borrow<nb::tuple>(h);
    if (state.size() != n)
      throw ValueError(std::string(cls) + ".__setstate__ takes a tuple of " + std::to_string(n) +
                       " fields but got " + std::to_string(state.size()));
    new (&d) D();
    for (size_t i = 0; i < n; ++i) set_field(d, fields<D>()[i], state[i]);
  });
}

void bind_activation(nb::module_& m) {
  static const std::string doc =
      "Gate activations of the contract's table (values " + activation_range() + ").";
  static std::vector<std::string> texts;  // names and docstrings, kept for nanobind
  texts.reserve(2 * std::size(kActivations));
  nb::enum_<Activation> e(m, "Activation", nb::is_arithmetic(), doc.c_str());
  for (const auto& a : kActivations) {
    texts.push_back(member_name(a.value));
    const char* name = texts.back().c_str();
    texts.push_back(std::string(a.name) + ": f(x) = " + a.formula);
    e.value(name, a.value, texts.back().c_str());
  }
}

// ---- operations -----------------------------------------------------------------------
// Each operation is an Op type: its name, the C++ function, its arrays as members of the
// inputs struct (in the struct's order) and its results as a tuple. A gradient Op names
// its Forward and lists only its own arrays: it takes the forward's required arrays first,
// then its own, then the forward's optional ones as keywords. def_op binds one; every
// argument arrives as an object so that a wrong one gets a message naming the operation
// and the argument rather than nanobind's overload dump.

// One array of an operation: a member of its inputs struct; required when a TensorView.
template <class In>
struct Arg {
  const char* name;
  TensorView In::*required = nullptr;
  std::optional<TensorView> In::*optional = nullptr;
  const char* hint = nullptr;  // after "is required: " when a required array is None

  constexpr Arg() : name(nullptr) {}
  constexpr Arg(const char* n, TensorView In::*m, const char* h = nullptr)
      : name(n), required(m), hint(h) {}
  constexpr Arg(const char* n, std::optional<TensorView> In::*m) : name(n), optional(m) {}
};

enum class Role { Required, Optional, KeywordOnly };  // KeywordOnly arrays are optional

// An array argument as Python sees it.
struct PyArg {
  const char* name = nullptr;
  Role role = Role::Required;
  const char* hint = nullptr;
};

template <class In>
constexpr PyArg py_arg(const Arg<In>& a, bool keyword) {
  return {a.name,
          a.required ? Role::Required
          : keyword  ? Role::KeywordOnly
                     : Role::Optional,
          a.hint};
}

template <class Op, class = void>
struct IsGradient : std::false_type {};
template <class Op>
struct IsGradient<Op, std::void_t<typename Op::Forward>> : std::true_type {};

// The Op's array arguments in Python's order.
template <class Op>
constexpr auto py_args() {
  if constexpr (IsGradient<Op>::value) {
    constexpr size_t nf = std::size(Op::Forward::args), n = std::size(Op::args);
    std::array<PyArg, nf + n> r{};
    for (size_t i = 0; i < nf + n; ++i)
      r[i] = i < 2       ? py_arg(Op::Forward::args[i], false)
             : i < 2 + n ? py_arg(Op::args[i - 2], true)
                         : py_arg(Op::Forward::args[i - n], true);
    return r;
  } else {
    std::array<PyArg, std::size(Op::args)> r{};
    for (size_t i = 0; i < r.size(); ++i) r[i] = py_arg(Op::args[i], false);
    return r;
  }
}

// The arrays of one call, read (as arrays) in Python's order; views are made from them
// in the inputs struct's order, which is the order of the dtype checks.
class CallArrays {
 public:
  static constexpr size_t kMax = 16;  // more than any operation's arrays (def_op checks)
  CallArrays(const char* op, const PyArg* specs, const nb::handle* handles, size_t n)
      : op_(op), specs_(specs), n_(n) {
    for (size_t i = 0; i < n; ++i)
      arrays_[i] =
          array_arg(op, specs[i].name, handles[i], specs[i].role == Role::Required, specs[i].hint);
  }
  // Sets the members of `in` that `args` (Arg<In>s) name.
  template <class In, class Args>
  void fill(In& in, const Args& args) const {
    for (const auto& a : args)
      if (a.required)
        in.*a.required = view(op_, a.name, *find(a.name));
      else
        in.*a.optional = view(op_, a.name, find(a.name));
  }

 private:
  const OptArray& find(const char* name) const {
    for (size_t i = 0; i < n_; ++i)  // py_args copies the names' pointers: found by them
      if (specs_[i].name == name) return arrays_[i];
    for (size_t i = 0; i < n_; ++i)
      if (std::string_view(specs_[i].name) == name) return arrays_[i];
    throw std::logic_error(std::string("no argument ") + name);
  }
  const char* op_;
  const PyArg* specs_;
  size_t n_;
  std::array<OptArray, kMax> arrays_;
};

template <class Op, class In>
void fill_inputs(const CallArrays& a, In& in) {
  if constexpr (IsGradient<Op>::value)
    fill_inputs<typename Op::Forward>(a, static_cast<typename Op::Forward::In&>(in));
  a.fill(in, Op::args);
}

template <class F>
struct Signature;
template <class R, class In, class D>
struct Signature<R (*)(const In&, const D&, Device)> {
  using Result = R;
  using Descriptor = D;
};

template <class... T>
nb::tuple numpy_tuple(const T&... t) {
  return nb::make_tuple(to_numpy(t)...);
}

template <class Op, size_t I>
auto arg_annotation() {
  constexpr auto args = py_args<Op>();
  constexpr PyArg spec = args[I];
  if constexpr (spec.role == Role::Required)
    return std::make_tuple(nb::arg(spec.name).none());
  else if constexpr (spec.role == Role::KeywordOnly &&
                     (I == 0 || args[I - 1].role != Role::KeywordOnly))
    return std::make_tuple(nb::kw_only(), nb::arg(spec.name).none() = nb::none());
  else
    return std::make_tuple(nb::arg(spec.name).none() = nb::none());
}

template <size_t>
using Handle = nb::handle;

template <class Op, size_t... I>
void def_op(nb::module_& m, std::index_sequence<I...>) {
  static constexpr auto args = py_args<Op>();
  static_assert(args.size() <= CallArrays::kMax);
  auto kw = [] {
    if constexpr (IsGradient<Op>::value)  // the gradient's own optional arrays start them
      return std::make_tuple();
    else
      return std::make_tuple(nb::kw_only());
  };
  auto annotations = std::tuple_cat(
      arg_annotation<Op, I>()..., kw(),
      std::make_tuple("sequence_lengths"_a.none() = nb::none(), "descriptor"_a.none() = nb::none(),
                      "device"_a.none() = nb::none()));
  auto fn = [](Handle<I>... arrays, nb::handle sequence_lengths, nb::handle descriptor,
               nb::handle device) {
    using S = Signature<std::remove_const_t<decltype(Op::run)>>;
    const nb::handle handles[] = {arrays...};
    const CallArrays a(Op::name, args.data(), handles, args.size());
    const auto desc =
        descriptor_arg<typename S::Descriptor>(Op::name, descriptor, IsGradient<Op>::value);
    const Device dev = device_arg(Op::name, device);
    typename Op::In in;
    fill_inputs<Op>(a, in);
    in.sequence_lengths = lengths_arg(Op::name, sequence_lengths);
    typename S::Result res;
    {
      nb::gil_scoped_release release;
      res = Op::run(in, desc, dev);
    }
    return Op::outputs(res);
  };
  std::apply([&](const auto&... extra) { m.def(Op::name, fn, extra...); }, annotations);
}

template <class Op>
void def_op(nb::module_& m) {
  def_op<Op>(m, std::make_index_sequence<py_args<Op>().size()>());
}

// A forward op's arrays: every inputs struct starts with these five, then `rest`.
template <class In, size_t N>
constexpr std::array<Arg<In>, 5 + N> forward_args(const Arg<In> (&rest)[N]) {
  std::array<Arg<In>, 5 + N> r{};
  r[0] = {"source", &In::source};
  r[1] = {"recurrent_weight", &In::recurrent_weight};
  r[2] = {"input_weight", &In::input_weight};
  r[3] = {"bias", &In::bias};
  r[4] = {"init_state", &In::init_state};
  for (size_t i = 0; i < N; ++i) r[5 + i] = rest[i];
  return r;
}

constexpr const char* kZStateHint = "run the forward with descriptor.training=True";

struct SingleGateRnn {
  using In = RNNInputs;
  static constexpr const char* name = "single_gate_rnn";
  static constexpr auto run = &single_gate_rnn;
  static constexpr auto args = forward_args<In>({{"mask", &In::mask}});
  static nb::tuple outputs(const RNNResults& r) { return numpy_tuple(r.state, r.z_state); }
};

struct Lstm {
  using In = LSTMInputs;
  static constexpr const char* name = "lstm";
  static constexpr auto run = &lstm;
  static constexpr auto args = forward_args<In>(
      {{"init_cell", &In::init_cell}, {"mask", &In::mask}, {"peephole", &In::peephole}});
  static nb::tuple outputs(const LSTMResults& r) { return numpy_tuple(r.state, r.cell, r.z_state); }
};

struct Gru {
  using In = GRUInputs;
  static constexpr const char* name = "gru";
  static constexpr auto run = &gru;
  static constexpr auto args =
      forward_args<In>({{"mask", &In::mask}, {"secondary_bias", &In::secondary_bias}});
  static nb::tuple outputs(const GRUResults& r) { return numpy_tuple(r.state, r.z_state); }
};

struct SingleGateRnnGradients {
  using Forward = SingleGateRnn;
  using In = RNNGradientInputs;
  static constexpr const char* name = "single_gate_rnn_gradients";
  static constexpr auto run = &single_gate_rnn_gradients;
  static constexpr Arg<In> args[] = {{"source_gradient", &In::source_gradient},
                                     {"z_state", &In::z_state, kZStateHint},
                                     {"state_gradient", &In::state_gradient}};
  static nb::tuple outputs(const RNNGradients& g) {
    return numpy_tuple(g.source, g.recurrent_weight, g.input_weight, g.bias, g.init_state);
  }
};

struct LstmGradients {
  using Forward = Lstm;
  using In = LSTMGradientInputs;
  static constexpr const char* name = "lstm_gradients";
  static constexpr auto run = &lstm_gradients;
  static constexpr Arg<In> args[] = {
      {"source_gradient", &In::source_gradient},
      {"z_state", &In::z_state, kZStateHint},
      {"cell_output_fwd", &In::cell_output_fwd,
       "pass the cell output of the forward run (training=True or produce_cell=True)"},
      {"state_gradient", &In::state_gradient},
      {"cell_gradient", &In::cell_gradient}};
  static nb::tuple outputs(const LSTMGradients& g) {
    return numpy_tuple(g.source, g.recurrent_weight, g.input_weight, g.bias, g.peephole,
                       g.init_state, g.init_cell);
  }
};

struct GruGradients {
  using Forward = Gru;
  using In = GRUGradientInputs;
  static constexpr const char* name = "gru_gradients";
  static constexpr auto run = &gru_gradients;
  static constexpr Arg<In> args[] = {
      {"source_gradient", &In::source_gradient},
      {"z_state", &In::z_state, kZStateHint},
      {"output_fwd", &In::output_fwd, "pass the state output of the forward run"},
      {"state_gradient", &In::state_gradient}};
  static nb::tuple outputs(const GRUGradients& g) {
    return numpy_tuple(g.source, g.recurrent_weight, g.input_weight, g.bias, g.init_state,
                       g.secondary_bias);
  }
};

}  // namespace
}  // namespace rnncore::python

NB_MODULE(_core, m) {
  using namespace rnncore;
  using namespace rnncore::python;
  m.doc() = "rnncore's compiled core; use the rnncore package.";

  nb::register_exception_translator([](const std::exception_ptr& p, void*) {
    try {
      std::rethrow_exception(p);
    } catch (const rnncore::ValueError& e) {
      PyErr_SetString(PyExc_ValueError, e.what());
    } catch (const rnncore::TypeError& e) {
      PyErr_SetString(PyExc_TypeError, e.what());
    } catch (const rnncore::OutOfMemoryError& e) {
      PyErr_SetString(PyExc_MemoryError, e.what());
    } catch (const rnncore::Error& e) {
      PyErr_SetString(PyExc_RuntimeError, e.what());
    }
  });

  bind_activation(m);
  bind_descriptor<RNNDescriptor>(m, "Single-gate RNN descriptor.");
  bind_descriptor<LSTMDescriptor>(m, "LSTM descriptor.");
  bind_descriptor<GRUDescriptor>(m, "GRU descriptor.");
  m.def("devices", &available_devices, "The devices this build can run here, best first.");
  m.def("build_info", [] {
    BuildInfo b = build_info();
    nb::dict d;
    d["version"] = b.version;
    d["blas"] = b.blas;
    d["compiler"] = b.compiler;
    d["devices"] = b.devices;
    d["threads"] = b.threads;
    d["kernels"] = b.kernels;
    d["cpu_quota"] = b.cpu_quota;
    return d;
  });
  m.def(
      "set_num_threads",
      [](nb::handle n) {
        if (PyBool_Check(n.ptr()) || !PyIndex_Check(n.ptr()))
          throw TypeError("[set_num_threads] n must be an int but got " + type_name_of(n));
        nb::object index = nb::steal(PyNumber_Index(n.ptr()));
        if (!index.is_valid()) throw nb::python_error();
        int overflow = 0;
        const long long v = PyLong_AsLongLongAndOverflow(index.ptr(), &overflow);
        if (overflow || v < 0 || v > 4096)
          throw ValueError("[set_num_threads] n must be in 0..4096 (0: the default) but is " +
                           text(index));
        set_num_threads(static_cast<int>(v));
      },
      nb::sig("def set_num_threads(n: int) -> None"),
      "Threads a call may use on the CPU; 0 restores the default (RNNCORE_NUM_THREADS, "
      "else every usable core: the CPU affinity, no more than the CPU quota of the "
      "process's cgroups).");
  m.def("num_threads", &num_threads, "Threads a call may use on the CPU.");
  m.def("set_metal_counting", &set_metal_counting, "on"_a,
        "Counting of the Metal kernels' memory traffic and FLOPs on device 'metal-emulated' "
        "(rnncore.bench.cost); results computed while it is on are not valid.");
  m.def(
      "take_metal_counts",
      [] {
        nb::list out;
        for (const DispatchCount& c : take_metal_counts()) {
          nb::dict d;
          d["plan"] = c.plan;
          d["kernel"] = c.kernel;
          d["threadgroups"] = c.threadgroups;
          d["threads_per_threadgroup"] = c.threads_per_threadgroup;
          d["bytes_read"] = c.bytes_read;
          d["bytes_written"] = c.bytes_written;
          d["barriers"] = c.barriers;
          d["flops"] = c.flops;
          d["repeated"] = c.repeated;
          out.append(d);
        }
        return out;
      },
      "The counted dispatches since counting started, as dicts, and clears them.");
  m.attr("__version__") = version();

  def_op<SingleGateRnn>(m);
  def_op<Lstm>(m);
  def_op<Gru>(m);
  def_op<SingleGateRnnGradients>(m);
  def_op<LstmGradients>(m);
  def_op<GruGradients>(m);
}
