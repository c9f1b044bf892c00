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

Device device_arg(const std::optional<std::string>& d) {
  return d ? parse_device(*d) : Device::Auto;
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
    const long long x = PyLong_AsLongLong(nb::handle(PyNumber_Index(v.ptr())).ptr());
    if (PyErr_Occurred()) PyErr_Clear();
    if (x < 0 || x > 4)
      throw ValueError(where + " must be an Activation (0..4) but got " + std::to_string(x));
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
      [cls](D* self, nb::kwargs kw) {
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
  c.def("__setstate__", [cls](D& d, const nb::tuple& state) {
    new (&d) D();
    const auto& fs = fields<D>();
    if (state.size() != fs.size()) throw ValueError(std::string(cls) + ": bad pickle state");
    for (size_t i = 0; i < fs.size(); ++i) set_field(cls, d, fs[i], state[i]);
  });
}

template <class D>
const D& descriptor_arg(const D* d) {
  static const D defaults{};
  return d ? *d : defaults;
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
  m.def("set_num_threads", &set_num_threads, "n"_a,
        "Threads a call may use on the CPU; 0 restores the default (RNNCORE_NUM_THREADS, "
        "else every usable core).");
  m.def("num_threads", &num_threads, "Threads a call may use on the CPU.");
  m.attr("__version__") = version();

  m.def(
      "single_gate_rnn",
      [](const Array& source, const Array& recurrent_weight, const OptArray& input_weight,
         const OptArray& bias, const OptArray& init_state, const OptArray& mask,
         const RNNDescriptor* descriptor, const std::optional<std::string>& device) {
        const char* op = "single_gate_rnn";
        RNNInputs in{view(op, "source", source),
                     view(op, "recurrent_weight", recurrent_weight),
                     view(op, "input_weight", input_weight),
                     view(op, "bias", bias),
                     view(op, "init_state", init_state),
                     view(op, "mask", mask)};
        const Device dev = device_arg(device);
        RNNResults r;
        {
          nb::gil_scoped_release release;
          r = single_gate_rnn(in, descriptor_arg(descriptor), dev);
        }
        return nb::make_tuple(to_numpy(r.state), to_numpy(r.z_state));
      },
      "source"_a, "recurrent_weight"_a, "input_weight"_a = nb::none(), "bias"_a = nb::none(),
      "init_state"_a = nb::none(), "mask"_a = nb::none(), nb::kw_only(),
      "descriptor"_a.none() = nb::none(), "device"_a.none() = nb::none());

  m.def(
      "lstm",
      [](const Array& source, const Array& recurrent_weight, const OptArray& input_weight,
         const OptArray& bias, const OptArray& init_state, const OptArray& init_cell,
         const OptArray& mask, const OptArray& peephole, const LSTMDescriptor* descriptor,
         const std::optional<std::string>& device) {
        const char* op = "lstm";
        LSTMInputs in{view(op, "source", source),
                      view(op, "recurrent_weight", recurrent_weight),
                      view(op, "input_weight", input_weight),
                      view(op, "bias", bias),
                      view(op, "init_state", init_state),
                      view(op, "init_cell", init_cell),
                      view(op, "mask", mask),
                      view(op, "peephole", peephole)};
        const Device dev = device_arg(device);
        LSTMResults r;
        {
          nb::gil_scoped_release release;
          r = lstm(in, descriptor_arg(descriptor), dev);
        }
        return nb::make_tuple(to_numpy(r.state), to_numpy(r.cell), to_numpy(r.z_state));
      },
      "source"_a, "recurrent_weight"_a, "input_weight"_a = nb::none(), "bias"_a = nb::none(),
      "init_state"_a = nb::none(), "init_cell"_a = nb::none(), "mask"_a = nb::none(),
      "peephole"_a = nb::none(), nb::kw_only(), "descriptor"_a.none() = nb::none(),
      "device"_a.none() = nb::none());

  m.def(
      "gru",
      [](const Array& source, const Array& recurrent_weight, const OptArray& input_weight,
         const OptArray& bias, const OptArray& init_state, const OptArray& mask,
         const OptArray& secondary_bias, const GRUDescriptor* descriptor,
         const std::optional<std::string>& device) {
        const char* op = "gru";
        GRUInputs in{view(op, "source", source),
                     view(op, "recurrent_weight", recurrent_weight),
                     view(op, "input_weight", input_weight),
                     view(op, "bias", bias),
                     view(op, "init_state", init_state),
                     view(op, "mask", mask),
                     view(op, "secondary_bias", secondary_bias)};
        const Device dev = device_arg(device);
        GRUResults r;
        {
          nb::gil_scoped_release release;
          r = gru(in, descriptor_arg(descriptor), dev);
        }
        return nb::make_tuple(to_numpy(r.state), to_numpy(r.z_state));
      },
      "source"_a, "recurrent_weight"_a, "input_weight"_a = nb::none(), "bias"_a = nb::none(),
      "init_state"_a = nb::none(), "mask"_a = nb::none(), "secondary_bias"_a = nb::none(),
      nb::kw_only(), "descriptor"_a.none() = nb::none(), "device"_a.none() = nb::none());

  m.def(
      "single_gate_rnn_gradients",
      [](const Array& source, const Array& recurrent_weight, const Array& source_gradient,
         const Array& z_state, const OptArray& state_gradient, const OptArray& input_weight,
         const OptArray& bias, const OptArray& init_state, const OptArray& mask,
         const RNNDescriptor* descriptor, const std::optional<std::string>& device) {
        const char* op = "single_gate_rnn_gradients";
        RNNGradientInputs in;
        static_cast<RNNInputs&>(in) = {view(op, "source", source),
                                       view(op, "recurrent_weight", recurrent_weight),
                                       view(op, "input_weight", input_weight),
                                       view(op, "bias", bias),
                                       view(op, "init_state", init_state),
                                       view(op, "mask", mask)};
        in.source_gradient = view(op, "source_gradient", source_gradient);
        in.z_state = view(op, "z_state", z_state);
        in.state_gradient = view(op, "state_gradient", state_gradient);
        const Device dev = device_arg(device);
        RNNGradients g;
        {
          nb::gil_scoped_release release;
          g = single_gate_rnn_gradients(in, descriptor_arg(descriptor), dev);
        }
        return nb::make_tuple(to_numpy(g.source), to_numpy(g.recurrent_weight),
                              to_numpy(g.input_weight), to_numpy(g.bias), to_numpy(g.init_state));
      },
      "source"_a, "recurrent_weight"_a, "source_gradient"_a, "z_state"_a, nb::kw_only(),
      "state_gradient"_a = nb::none(), "input_weight"_a = nb::none(), "bias"_a = nb::none(),
      "init_state"_a = nb::none(), "mask"_a = nb::none(), "descriptor"_a.none() = nb::none(),
      "device"_a.none() = nb::none());

  m.def(
      "lstm_gradients",
      [](const Array& source, const Array& recurrent_weight, const Array& source_gradient,
         const Array& z_state, const Array& cell_output_fwd, const OptArray& state_gradient,
         const OptArray& cell_gradient, const OptArray& input_weight, const OptArray& bias,
         const OptArray& init_state, const OptArray& init_cell, const OptArray& mask,
         const OptArray& peephole, const LSTMDescriptor* descriptor,
         const std::optional<std::string>& device) {
        const char* op = "lstm_gradients";
        LSTMGradientInputs in;
        static_cast<LSTMInputs&>(in) = {view(op, "source", source),
                                        view(op, "recurrent_weight", recurrent_weight),
                                        view(op, "input_weight", input_weight),
                                        view(op, "bias", bias),
                                        view(op, "init_state", init_state),
                                        view(op, "init_cell", init_cell),
                                        view(op, "mask", mask),
                                        view(op, "peephole", peephole)};
        in.source_gradient = view(op, "source_gradient", source_gradient);
        in.z_state = view(op, "z_state", z_state);
        in.cell_output_fwd = view(op, "cell_output_fwd", cell_output_fwd);
        in.state_gradient = view(op, "state_gradient", state_gradient);
        in.cell_gradient = view(op, "cell_gradient", cell_gradient);
        const Device dev = device_arg(device);
        LSTMGradients g;
        {
          nb::gil_scoped_release release;
          g = lstm_gradients(in, descriptor_arg(descriptor), dev);
        }
        return nb::make_tuple(to_numpy(g.source), to_numpy(g.recurrent_weight),
                              to_numpy(g.input_weight), to_numpy(g.bias), to_numpy(g.peephole),
                              to_numpy(g.init_state), to_numpy(g.init_cell));
      },
      "source"_a, "recurrent_weight"_a, "source_gradient"_a, "z_state"_a, "cell_output_fwd"_a,
      nb::kw_only(), "state_gradient"_a = nb::none(), "cell_gradient"_a = nb::none(),
      "input_weight"_a = nb::none(), "bias"_a = nb::none(), "init_state"_a = nb::none(),
      "init_cell"_a = nb::none(), "mask"_a = nb::none(), "peephole"_a = nb::none(),
      "descriptor"_a.none() = nb::none(), "device"_a.none() = nb::none());

  m.def(
      "gru_gradients",
      [](const Array& source, const Array& recurrent_weight, const Array& source_gradient,
         const Array& z_state, const Array& output_fwd, const OptArray& state_gradient,
         const OptArray& input_weight, const OptArray& bias, const OptArray& init_state,
         const OptArray& mask, const OptArray& secondary_bias, const GRUDescriptor* descriptor,
         const std::optional<std::string>& device) {
        const char* op = "gru_gradients";
        GRUGradientInputs in;
        static_cast<GRUInputs&>(in) = {view(op, "source", source),
                                       view(op, "recurrent_weight", recurrent_weight),
                                       view(op, "input_weight", input_weight),
                                       view(op, "bias", bias),
                                       view(op, "init_state", init_state),
                                       view(op, "mask", mask),
                                       view(op, "secondary_bias", secondary_bias)};
        in.source_gradient = view(op, "source_gradient", source_gradient);
        in.z_state = view(op, "z_state", z_state);
        in.output_fwd = view(op, "output_fwd", output_fwd);
        in.state_gradient = view(op, "state_gradient", state_gradient);
        const Device dev = device_arg(device);
        GRUGradients g;
        {
          nb::gil_scoped_release release;
          g = gru_gradients(in, descriptor_arg(descriptor), dev);
        }
        return nb::make_tuple(to_numpy(g.source), to_numpy(g.recurrent_weight),
                              to_numpy(g.input_weight), to_numpy(g.bias), to_numpy(g.init_state),
                              to_numpy(g.secondary_bias));
      },
      "source"_a, "recurrent_weight"_a, "source_gradient"_a, "z_state"_a, "output_fwd"_a,
      nb::kw_only(), "state_gradient"_a = nb::none(), "input_weight"_a = nb::none(),
      "bias"_a = nb::none(), "init_state"_a = nb::none(), "mask"_a = nb::none(),
      "secondary_bias"_a = nb::none(), "descriptor"_a.none() = nb::none(),
      "device"_a.none() = nb::none());
}
