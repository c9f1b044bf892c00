// rnncore._core: the nanobind module. Arrays come in through nb::ndarray (buffer
// protocol or DLPack, read in place when C-contiguous), go out as numpy arrays that own
// rnncore's storage through a capsule (no copy). The GIL is released while computing.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <string>
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

TensorView view(const char* op, const char* name, const Array& a) {
  DType dt;
  if (a.dtype() == nb::dtype<float>())
    dt = DType::Float32;
  else if (a.dtype() == nb::dtype<double>())
    dt = DType::Float64;
  else if (a.dtype() == kFloat16)
    dt = DType::Float16;
  else
    throw TypeError(std::string("[") + op + "] " + name +
                    " must be a float32, float64 or float16 array but has dtype " +
                    dtype_text(a.dtype()));
  Shape shape(a.ndim());
  for (size_t i = 0; i < a.ndim(); ++i) shape[i] = static_cast<int64_t>(a.shape(i));
  return TensorView(a.data(), std::move(shape), dt);
}

std::optional<TensorView> view(const char* op, const char* name, const OptArray& a) {
  if (!a) return std::nullopt;
  return view(op, name, *a);
}

nb::object to_numpy(const Tensor& t) {
  auto* keep = new std::shared_ptr<void>(t.storage());
  nb::capsule owner(keep, [](void* p) noexcept { delete static_cast<std::shared_ptr<void>*>(p); });
  std::vector<size_t> shape(t.shape().begin(), t.shape().end());
  const nb::dlpack::dtype dt = t.dtype() == DType::Float32   ? nb::dtype<float>()
                               : t.dtype() == DType::Float64 ? nb::dtype<double>()
                                                             : kFloat16;
  nb::ndarray<nb::numpy> arr(const_cast<void*>(t.data()), shape.size(), shape.data(), owner,
                             nullptr, dt);
  return nb::cast(arr, nb::rv_policy::reference);
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

// Reads argument `name` of `op`: an array, or nothing for None. A required argument that
// is None gets `hint` after the message.
OptArray array_arg(const char* op, const char* name, nb::handle h, bool required,
                   const char* hint = nullptr) {
  const std::string where = std::string("[") + op + "] " + name;
  if (h.is_none()) {
    if (!required) return std::nullopt;
    throw TypeError(where + " is required" + (hint ? std::string(": ") + hint : std::string()));
  }
  Array a;
  if (!nb::try_cast<Array>(h, a, true)) refuse_array(where, h);
  return a;
}

Array required_array(const char* op, const char* name, nb::handle h, const char* hint = nullptr) {
  return *array_arg(op, name, h, true, hint);
}

Device device_arg(const char* op, nb::handle h) {
  if (h.is_none()) return Device::Auto;
  if (!nb::isinstance<nb::str>(h))
    throw TypeError(std::string("[") + op + "] device must be a str or None but got " +
                    type_name_of(h));
  const std::string name = nb::cast<std::string>(h);
  // None means the default device; an empty name is a mistake, not another spelling of it.
  if (name.empty())
    throw ValueError(std::string("[") + op +
                     "] unknown device ''; known devices are 'cpu', 'metal' and "
                     "'metal-emulated' (None for the default)");
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
D descriptor_arg(const char* op, const char* cls, nb::handle h, bool required) {
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

template <class D>
struct Field {
  const char* name;
  bool D::*flag;
  Activation D::*act;
};

template <class D>
const std::vector<Field<D>>& fields();

template <>
const std::vector<Field<RNNDescriptor>>& fields() {
  using D = RNNDescriptor;
  static const std::vector<Field<D>> f = {{"reverse", &D::reverse, nullptr},
                                          {"bidirectional", &D::bidirectional, nullptr},
                                          {"training", &D::training, nullptr},
                                          {"activation", nullptr, &D::activation}};
  return f;
}

template <>
const std::vector<Field<LSTMDescriptor>>& fields() {
  using D = LSTMDescriptor;
  static const std::vector<Field<D>> f = {
      {"reverse", &D::reverse, nullptr},
      {"bidirectional", &D::bidirectional, nullptr},
      {"produce_cell", &D::produce_cell, nullptr},
      {"training", &D::training, nullptr},
      {"forget_gate_last", &D::forget_gate_last, nullptr},
      {"input_gate_activation", nullptr, &D::input_gate_activation},
      {"forget_gate_activation", nullptr, &D::forget_gate_activation},
      {"cell_gate_activation", nullptr, &D::cell_gate_activation},
      {"output_gate_activation", nullptr, &D::output_gate_activation},
      {"activation", nullptr, &D::activation}};
  return f;
}

template <>
const std::vector<Field<GRUDescriptor>>& fields() {
  using D = GRUDescriptor;
  static const std::vector<Field<D>> f = {
      {"reverse", &D::reverse, nullptr},
      {"bidirectional", &D::bidirectional, nullptr},
      {"training", &D::training, nullptr},
      {"reset_gate_first", &D::reset_gate_first, nullptr},
      {"reset_after", &D::reset_after, nullptr},
      {"flip_z", &D::flip_z, nullptr},
      {"update_gate_activation", nullptr, &D::update_gate_activation},
      {"reset_gate_activation", nullptr, &D::reset_gate_activation},
      {"output_gate_activation", nullptr, &D::output_gate_activation}};
  return f;
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
void set_field(const char* cls, D& d, const Field<D>& f, nb::handle v) {
  const std::string where = std::string(cls) + "." + f.name;
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
    d.*f.act = nb::cast<Activation>(v);
    return;
  }
  if (!PyBool_Check(v.ptr()) && PyIndex_Check(v.ptr())) {
    // PyNumber_Index returns a new reference: steal it so it is released.
    nb::object index = nb::steal(PyNumber_Index(v.ptr()));
    if (!index.is_valid()) throw nb::python_error();
    int overflow = 0;
    const long long x = PyLong_AsLongLongAndOverflow(index.ptr(), &overflow);
    if (overflow || x < 0 || x > 4)
      throw ValueError(where + " must be an Activation (0..4) but got " + text(index));
    d.*f.act = static_cast<Activation>(x);
    return;
  }
  throw TypeError(where + " must be an rnncore.Activation or an int in 0..4 but got " +
                  nb::cast<std::string>(nb::type_name(v.type())));
}

template <class D>
std::string signature(const char* cls) {
  std::string s = "def __init__(self, *";
  for (const auto& f : fields<D>()) {
    D def;
    s += std::string(", ") + f.name;
    if (f.flag)
      s += std::string(": bool = ") + (def.*f.flag ? "True" : "False");
    else
      // Stub convention for a non-literal default; the docstring names the value.
      s += ": Activation | int = ...";
  }
  (void)cls;
  return s + ") -> None";
}

const char* act_enum_name(Activation a) {
  switch (a) {
    case Activation::None: return "NONE";
    case Activation::Relu: return "RELU";
    case Activation::Tanh: return "TANH";
    case Activation::Sigmoid: return "SIGMOID";
    case Activation::HardSigmoid: return "HARD_SIGMOID";
  }
  return "?";
}

template <class D>
std::string repr_of(const char* cls, const D& d) {
  std::string s = std::string(cls) + "(";
  bool first = true;
  for (const auto& f : fields<D>()) {
    if (!first) s += ", ";
    first = false;
    s += std::string(f.name) + "=";
    s += f.flag ? (d.*f.flag ? "True" : "False")
                : std::string("Activation.") + act_enum_name(d.*f.act);
  }
  return s + ")";
}

template <class D>
void bind_descriptor(nb::module_& m, const char* cls, const char* doc) {
  static const std::string sig = signature<D>(cls);
  static const std::string full_doc =
      std::string(doc) + "\n\nMPSGraph's defaults: " + repr_of(cls, D{}) + ".";
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
              set_field(cls, *self, f, v);
              found = true;
            }
          if (!found)
            throw TypeError(std::string(cls) + "() got an unexpected keyword argument '" + key +
                            "'");
        }
      },
      nb::sig(sig.c_str()));
  for (const auto& f : fields<D>()) {
    if (f.flag)
      c.def_prop_rw(
          f.name, [f](const D& d) { return d.*f.flag; },
          [f, cls](D& d, nb::handle v) { set_field(cls, d, f, v); },
          nb::for_setter(
              nb::sig((std::string("def ") + f.name + "(self, arg: bool, /) -> None").c_str())));
    else
      c.def_prop_rw(
          f.name, [f](const D& d) { return d.*f.act; },
          [f, cls](D& d, nb::handle v) { set_field(cls, d, f, v); },
          nb::for_setter(
              nb::sig((std::string("def ") + f.name + "(self, arg: Activation | int, /) -> None")
                          .c_str())));
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
  c.def("__repr__", [cls](const D& d) { return repr_of(cls, d); });
  c.def("__copy__", [](const D& d) { return D(d); });
  c.def(
      "__deepcopy__", [](const D& d, nb::handle) { return D(d); }, "memo"_a);
  c.def("__getstate__", [](const D& d) {
    nb::list state;
    for (const auto& f : fields<D>())
      if (f.flag)
        state.append(d.*f.flag);
      else
        state.append(static_cast<int>(d.*f.act));
    return nb::tuple(state);
  });
  c.def("__setstate__", [cls](D& d, nb::handle h) {
    const auto& fs = fields<D>();
    if (!nb::isinstance<nb::tuple>(h))
      throw TypeError(std::string(cls) + ".__setstate__ takes a tuple of " +
                      std::to_string(fs.size()) + " fields but got " + type_name_of(h));
    const nb::tuple state = nb::borrow<nb::tuple>(h);
    if (state.size() != fs.size())
      throw ValueError(std::string(cls) + ".__setstate__ takes a tuple of " +
                       std::to_string(fs.size()) + " fields but got " +
                       std::to_string(state.size()));
    new (&d) D();
    for (size_t i = 0; i < fs.size(); ++i) set_field(cls, d, fs[i], state[i]);
  });
}

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

  nb::enum_<Activation>(m, "Activation", nb::is_arithmetic(),
                        "Gate activations of the contract's table (values 0..4).")
      .value("NONE", Activation::None)
      .value("RELU", Activation::Relu)
      .value("TANH", Activation::Tanh)
      .value("SIGMOID", Activation::Sigmoid)
      .value("HARD_SIGMOID", Activation::HardSigmoid);

  bind_descriptor<RNNDescriptor>(m, "RNNDescriptor", "Single-gate RNN descriptor.");
  bind_descriptor<LSTMDescriptor>(m, "LSTMDescriptor", "LSTM descriptor.");
  bind_descriptor<GRUDescriptor>(m, "GRUDescriptor", "GRU descriptor.");

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
      "else every usable core).");
  m.def("num_threads", &num_threads, "Threads a call may use on the CPU.");
  m.attr("__version__") = version();

  // Every argument arrives as an object so that a wrong one gets a message naming the
  // operation and the argument rather than nanobind's overload dump.
  using H = nb::handle;
  m.def(
      "single_gate_rnn",
      [](H source, H recurrent_weight, H input_weight, H bias, H init_state, H mask, H descriptor,
         H device) {
        const char* op = "single_gate_rnn";
        const Array x = required_array(op, "source", source);
        const Array r = required_array(op, "recurrent_weight", recurrent_weight);
        const OptArray w = array_arg(op, "input_weight", input_weight, false),
                       b = array_arg(op, "bias", bias, false),
                       h0 = array_arg(op, "init_state", init_state, false),
                       mk = array_arg(op, "mask", mask, false);
        const auto desc = descriptor_arg<RNNDescriptor>(op, "RNNDescriptor", descriptor, false);
        const Device dev = device_arg(op, device);
        RNNInputs in{view(op, "source", x),       view(op, "recurrent_weight", r),
                     view(op, "input_weight", w), view(op, "bias", b),
                     view(op, "init_state", h0),  view(op, "mask", mk)};
        RNNResults res;
        {
          nb::gil_scoped_release release;
          res = single_gate_rnn(in, desc, dev);
        }
        return nb::make_tuple(to_numpy(res.state), to_numpy(res.z_state));
      },
      "source"_a.none(), "recurrent_weight"_a.none(), "input_weight"_a.none() = nb::none(),
      "bias"_a.none() = nb::none(), "init_state"_a.none() = nb::none(),
      "mask"_a.none() = nb::none(), nb::kw_only(), "descriptor"_a.none() = nb::none(),
      "device"_a.none() = nb::none());

  m.def(
      "lstm",
      [](H source, H recurrent_weight, H input_weight, H bias, H init_state, H init_cell, H mask,
         H peephole, H descriptor, H device) {
        const char* op = "lstm";
        const Array x = required_array(op, "source", source);
        const Array r = required_array(op, "recurrent_weight", recurrent_weight);
        const OptArray w = array_arg(op, "input_weight", input_weight, false),
                       b = array_arg(op, "bias", bias, false),
                       h0 = array_arg(op, "init_state", init_state, false),
                       c0 = array_arg(op, "init_cell", init_cell, false),
                       mk = array_arg(op, "mask", mask, false),
                       ph = array_arg(op, "peephole", peephole, false);
        const auto desc = descriptor_arg<LSTMDescriptor>(op, "LSTMDescriptor", descriptor, false);
        const Device dev = device_arg(op, device);
        LSTMInputs in{view(op, "source", x),       view(op, "recurrent_weight", r),
                      view(op, "input_weight", w), view(op, "bias", b),
                      view(op, "init_state", h0),  view(op, "init_cell", c0),
                      view(op, "mask", mk),        view(op, "peephole", ph)};
        LSTMResults res;
        {
          nb::gil_scoped_release release;
          res = lstm(in, desc, dev);
        }
        return nb::make_tuple(to_numpy(res.state), to_numpy(res.cell), to_numpy(res.z_state));
      },
      "source"_a.none(), "recurrent_weight"_a.none(), "input_weight"_a.none() = nb::none(),
      "bias"_a.none() = nb::none(), "init_state"_a.none() = nb::none(),
      "init_cell"_a.none() = nb::none(), "mask"_a.none() = nb::none(),
      "peephole"_a.none() = nb::none(), nb::kw_only(), "descriptor"_a.none() = nb::none(),
      "device"_a.none() = nb::none());

  m.def(
      "gru",
      [](H source, H recurrent_weight, H input_weight, H bias, H init_state, H mask,
         H secondary_bias, H descriptor, H device) {
        const char* op = "gru";
        const Array x = required_array(op, "source", source);
        const Array r = required_array(op, "recurrent_weight", recurrent_weight);
        const OptArray w = array_arg(op, "input_weight", input_weight, false),
                       b = array_arg(op, "bias", bias, false),
                       h0 = array_arg(op, "init_state", init_state, false),
                       mk = array_arg(op, "mask", mask, false),
                       b2 = array_arg(op, "secondary_bias", secondary_bias, false);
        const auto desc = descriptor_arg<GRUDescriptor>(op, "GRUDescriptor", descriptor, false);
        const Device dev = device_arg(op, device);
        GRUInputs in{view(op, "source", x),         view(op, "recurrent_weight", r),
                     view(op, "input_weight", w),   view(op, "bias", b),
                     view(op, "init_state", h0),    view(op, "mask", mk),
                     view(op, "secondary_bias", b2)};
        GRUResults res;
        {
          nb::gil_scoped_release release;
          res = gru(in, desc, dev);
        }
        return nb::make_tuple(to_numpy(res.state), to_numpy(res.z_state));
      },
      "source"_a.none(), "recurrent_weight"_a.none(), "input_weight"_a.none() = nb::none(),
      "bias"_a.none() = nb::none(), "init_state"_a.none() = nb::none(),
      "mask"_a.none() = nb::none(), "secondary_bias"_a.none() = nb::none(), nb::kw_only(),
      "descriptor"_a.none() = nb::none(), "device"_a.none() = nb::none());

  static const char* const kZStateHint = "run the forward with descriptor.training=True";
  m.def(
      "single_gate_rnn_gradients",
      [](H source, H recurrent_weight, H source_gradient, H z_state, H state_gradient,
         H input_weight, H bias, H init_state, H mask, H descriptor, H device) {
        const char* op = "single_gate_rnn_gradients";
        const Array x = required_array(op, "source", source);
        const Array r = required_array(op, "recurrent_weight", recurrent_weight);
        const Array dy = required_array(op, "source_gradient", source_gradient);
        const Array z = required_array(op, "z_state", z_state, kZStateHint);
        const OptArray dh = array_arg(op, "state_gradient", state_gradient, false),
                       w = array_arg(op, "input_weight", input_weight, false),
                       b = array_arg(op, "bias", bias, false),
                       h0 = array_arg(op, "init_state", init_state, false),
                       mk = array_arg(op, "mask", mask, false);
        const auto desc = descriptor_arg<RNNDescriptor>(op, "RNNDescriptor", descriptor, true);
        const Device dev = device_arg(op, device);
        RNNGradientInputs in;
        static_cast<RNNInputs&>(in) = {view(op, "source", x),       view(op, "recurrent_weight", r),
                                       view(op, "input_weight", w), view(op, "bias", b),
                                       view(op, "init_state", h0),  view(op, "mask", mk)};
        in.source_gradient = view(op, "source_gradient", dy);
        in.z_state = view(op, "z_state", z);
        in.state_gradient = view(op, "state_gradient", dh);
        RNNGradients g;
        {
          nb::gil_scoped_release release;
          g = single_gate_rnn_gradients(in, desc, dev);
        }
        return nb::make_tuple(to_numpy(g.source), to_numpy(g.recurrent_weight),
                              to_numpy(g.input_weight), to_numpy(g.bias), to_numpy(g.init_state));
      },
      "source"_a.none(), "recurrent_weight"_a.none(), "source_gradient"_a.none(),
      "z_state"_a.none(), nb::kw_only(), "state_gradient"_a.none() = nb::none(),
      "input_weight"_a.none() = nb::none(), "bias"_a.none() = nb::none(),
      "init_state"_a.none() = nb::none(), "mask"_a.none() = nb::none(),
      "descriptor"_a.none() = nb::none(), "device"_a.none() = nb::none());

  m.def(
      "lstm_gradients",
      [](H source, H recurrent_weight, H source_gradient, H z_state, H cell_output_fwd,
         H state_gradient, H cell_gradient, H input_weight, H bias, H init_state, H init_cell,
         H mask, H peephole, H descriptor, H device) {
        const char* op = "lstm_gradients";
        const Array x = required_array(op, "source", source);
        const Array r = required_array(op, "recurrent_weight", recurrent_weight);
        const Array dy = required_array(op, "source_gradient", source_gradient);
        const Array z = required_array(op, "z_state", z_state, kZStateHint);
        const Array cf = required_array(op, "cell_output_fwd", cell_output_fwd,
                                        "pass the cell output of the forward run (training=True "
                                        "or produce_cell=True)");
        const OptArray dh = array_arg(op, "state_gradient", state_gradient, false),
                       dc = array_arg(op, "cell_gradient", cell_gradient, false),
                       w = array_arg(op, "input_weight", input_weight, false),
                       b = array_arg(op, "bias", bias, false),
                       h0 = array_arg(op, "init_state", init_state, false),
                       c0 = array_arg(op, "init_cell", init_cell, false),
                       mk = array_arg(op, "mask", mask, false),
                       ph = array_arg(op, "peephole", peephole, false);
        const auto desc = descriptor_arg<LSTMDescriptor>(op, "LSTMDescriptor", descriptor, true);
        const Device dev = device_arg(op, device);
        LSTMGradientInputs in;
        static_cast<LSTMInputs&>(in) = {
            view(op, "source", x), view(op, "recurrent_weight", r), view(op, "input_weight", w),
            view(op, "bias", b),   view(op, "init_state", h0),      view(op, "init_cell", c0),
            view(op, "mask", mk),  view(op, "peephole", ph)};
        in.source_gradient = view(op, "source_gradient", dy);
        in.z_state = view(op, "z_state", z);
        in.cell_output_fwd = view(op, "cell_output_fwd", cf);
        in.state_gradient = view(op, "state_gradient", dh);
        in.cell_gradient = view(op, "cell_gradient", dc);
        LSTMGradients g;
        {
          nb::gil_scoped_release release;
          g = lstm_gradients(in, desc, dev);
        }
        return nb::make_tuple(to_numpy(g.source), to_numpy(g.recurrent_weight),
                              to_numpy(g.input_weight), to_numpy(g.bias), to_numpy(g.peephole),
                              to_numpy(g.init_state), to_numpy(g.init_cell));
      },
      "source"_a.none(), "recurrent_weight"_a.none(), "source_gradient"_a.none(),
      "z_state"_a.none(), "cell_output_fwd"_a.none(), nb::kw_only(),
      "state_gradient"_a.none() = nb::none(), "cell_gradient"_a.none() = nb::none(),
      "input_weight"_a.none() = nb::none(), "bias"_a.none() = nb::none(),
      "init_state"_a.none() = nb::none(), "init_cell"_a.none() = nb::none(),
      "mask"_a.none() = nb::none(), "peephole"_a.none() = nb::none(),
      "descriptor"_a.none() = nb::none(), "device"_a.none() = nb::none());

  m.def(
      "gru_gradients",
      [](H source, H recurrent_weight, H source_gradient, H z_state, H output_fwd, H state_gradient,
         H input_weight, H bias, H init_state, H mask, H secondary_bias, H descriptor, H device) {
        const char* op = "gru_gradients";
        const Array x = required_array(op, "source", source);
        const Array r = required_array(op, "recurrent_weight", recurrent_weight);
        const Array dy = required_array(op, "source_gradient", source_gradient);
        const Array z = required_array(op, "z_state", z_state, kZStateHint);
        const Array yf = required_array(op, "output_fwd", output_fwd,
                                        "pass the state output of the forward run");
        const OptArray dh = array_arg(op, "state_gradient", state_gradient, false),
                       w = array_arg(op, "input_weight", input_weight, false),
                       b = array_arg(op, "bias", bias, false),
                       h0 = array_arg(op, "init_state", init_state, false),
                       mk = array_arg(op, "mask", mask, false),
                       b2 = array_arg(op, "secondary_bias", secondary_bias, false);
        const auto desc = descriptor_arg<GRUDescriptor>(op, "GRUDescriptor", descriptor, true);
        const Device dev = device_arg(op, device);
        GRUGradientInputs in;
        static_cast<GRUInputs&>(in) = {
            view(op, "source", x),         view(op, "recurrent_weight", r),
            view(op, "input_weight", w),   view(op, "bias", b),
            view(op, "init_state", h0),    view(op, "mask", mk),
            view(op, "secondary_bias", b2)};
        in.source_gradient = view(op, "source_gradient", dy);
        in.z_state = view(op, "z_state", z);
        in.output_fwd = view(op, "output_fwd", yf);
        in.state_gradient = view(op, "state_gradient", dh);
        GRUGradients g;
        {
          nb::gil_scoped_release release;
          g = gru_gradients(in, desc, dev);
        }
        return nb::make_tuple(to_numpy(g.source), to_numpy(g.recurrent_weight),
                              to_numpy(g.input_weight), to_numpy(g.bias), to_numpy(g.init_state),
                              to_numpy(g.secondary_bias));
      },
      "source"_a.none(), "recurrent_weight"_a.none(), "source_gradient"_a.none(),
      "z_state"_a.none(), "output_fwd"_a.none(), nb::kw_only(),
      "state_gradient"_a.none() = nb::none(), "input_weight"_a.none() = nb::none(),
      "bias"_a.none() = nb::none(), "init_state"_a.none() = nb::none(),
      "mask"_a.none() = nb::none(), "secondary_bias"_a.none() = nb::none(),
      "descriptor"_a.none() = nb::none(), "device"_a.none() = nb::none());
}
