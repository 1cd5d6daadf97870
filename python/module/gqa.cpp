// The model and GQA: the Model class (a model's KV geometry, presets) and the
// functions that aggregate attention over a model's streams (layers x KV heads).
#include <string>
#include <vector>

#include "bind.h"

namespace cxltier::python {
namespace {

// ---- the model ----

Model MakeModel(uint32_t layers, uint32_t query_heads, uint32_t kv_heads, uint32_t head_dim,
                uint32_t dtype_bytes, uint32_t block_tokens, const std::string& name) {
  Model m;
  m.name = name;
  m.g = ModelGeometry{"", layers, query_heads, kv_heads, head_dim, dtype_bytes, block_tokens};
  return m;
}

Model FromPreset(const ModelGeometry& g) {
  Model m;
  m.name = std::string(g.name);
  m.g = g;
  return m;
}

// ---- aggregation ----

Reduce ToReduce(const std::string& how) {
  if (how == "sum") return Reduce::kSum;
  if (how == "mean") return Reduce::kMean;
  if (how == "max") return Reduce::kMax;
  throw py::value_error("how is 'sum', 'mean' or 'max', not '" + how + "'");
}

// per_stream: (..., layers * kv_heads) float32 -> (...) masses.
py::object AggregateStreamsPy(const Model& model, py::handle per_stream, const std::string& how) {
  auto a = py::array_t<float, py::array::c_style | py::array::forcecast>::ensure(per_stream);
  if (!a) throw py::type_error("per_stream must be numbers");
  const ModelGeometry g = model.geometry();
  const size_t streams = g.streams();
  const Reduce r = ToReduce(how);
  if (a.ndim() == 0) throw py::value_error("per_stream needs a last axis of layers x kv_heads");
  const size_t last = static_cast<size_t>(a.shape(a.ndim() - 1));
  if (last != streams) {
    throw py::value_error("the last axis has " + std::to_string(last) + " values, not the " +
                          std::to_string(streams) + " streams (layers x kv_heads)");
  }
  std::vector<py::ssize_t> shape(a.shape(), a.shape() + a.ndim() - 1);
  py::array_t<float> out(shape);
  const size_t rows = streams ? static_cast<size_t>(a.size()) / streams : 0;
  const float* in = a.data();
  float* o = out.mutable_data();
  {
    py::gil_scoped_release nogil;
    for (size_t i = 0; i < rows; ++i) o[i] = AggregateStreams(g, {in + i * streams, streams}, r);
  }
  if (a.ndim() == 1) return py::float_(o[0]);
  return out;
}

// per_query_head: (..., layers * query_heads) -> (..., layers * kv_heads).
py::array_t<float> QueryHeadsToStreamsPy(const Model& model, py::handle per_qh,
                                         const std::string& how) {
  auto a = py::array_t<float, py::array::c_style | py::array::forcecast>::ensure(per_qh);
  if (!a) throw py::type_error("per_query_head must be numbers");
  const ModelGeometry g = model.geometry();
  const size_t in_n = uint64_t{g.layers} * g.query_heads, out_n = g.streams();
  if (a.ndim() == 0 || static_cast<size_t>(a.shape(a.ndim() - 1)) != in_n || in_n == 0) {
    throw py::value_error("the last axis must hold layers x query_heads = " + std::to_string(in_n) +
                          " values");
  }
  std::vector<py::ssize_t> shape(a.shape(), a.shape() + a.ndim());
  shape.back() = static_cast<py::ssize_t>(out_n);
  py::array_t<float> out(shape);
  const size_t rows = static_cast<size_t>(a.size()) / in_n;
  const Reduce r = ToReduce(how);
  bool ok = true;
  {
    py::gil_scoped_release nogil;
    for (size_t i = 0; i < rows && ok; ++i) {
      ok = QueryHeadsToStreams(g, {a.data() + i * in_n, in_n},
                               {out.mutable_data() + i * out_n, out_n}, r);
    }
  }
  if (!ok) throw py::value_error("query heads do not divide into the model's KV heads");
  return out;
}

}  // namespace

void BindModel(py::module_& m) {
  py::class_<Model>(m, "Model", "A model's KV geometry (what a block holds).")
      .def(py::init(&MakeModel), py::arg("layers"), py::arg("query_heads"), py::arg("kv_heads"),
           py::arg("head_dim"), py::arg("dtype_bytes") = 2, py::arg("block_tokens") = 16,
           py::arg("name") = "custom")
      .def_static(
          "preset",
          [](const std::string& name) {
            auto g = FindModelPreset(name);
            if (!g) throw py::value_error("no model preset called " + name);
            return FromPreset(*g);
          },
          py::arg("name"), "A built-in preset: llama3-70b, mistral-7b, ...")
      .def_static("presets",
                  [] {
                    std::vector<std::string> names;
                    for (const auto& g : kModelPresets) names.emplace_back(g.name);
                    return names;
                  })
      .def_readwrite("name", &Model::name)
      .def_property_readonly("layers", [](const Model& x) { return x.g.layers; })
      .def_property_readonly("query_heads", [](const Model& x) { return x.g.query_heads; })
      .def_property_readonly("kv_heads", [](const Model& x) { return x.g.kv_heads; })
      .def_property_readonly("head_dim", [](const Model& x) { return x.g.head_dim; })
      .def_property_readonly("dtype_bytes", [](const Model& x) { return x.g.dtype_bytes; })
      .def_property_readonly("block_tokens", [](const Model& x) { return x.g.block_tokens; })
      .def_property_readonly("gqa_group", [](const Model& x) { return x.g.gqa_group(); })
      .def_property_readonly("streams", [](const Model& x) { return x.g.streams(); })
      .def_property_readonly("block_bytes", [](const Model& x) { return x.g.block_bytes(); })
      .def_property_readonly("bytes_per_token",
                             [](const Model& x) { return x.g.bytes_per_token(); })
      .def(
          "validate", [](const Model& x) { Check(x.geometry().Validate()); },
          "Raises GeometryError when the geometry is unusable.")
      .def("__repr__", [](const Model& x) {
        return "cxltier.Model(layers=" + std::to_string(x.g.layers) +
               ", query_heads=" + std::to_string(x.g.query_heads) +
               ", kv_heads=" + std::to_string(x.g.kv_heads) +
               ", head_dim=" + std::to_string(x.g.head_dim) +
               ", dtype_bytes=" + std::to_string(x.g.dtype_bytes) +
               ", block_tokens=" + std::to_string(x.g.block_tokens) + ", name='" + x.name + "')";
      });
}

void BindGqa(py::module_& m) {
  m.def("aggregate_streams", &AggregateStreamsPy, py::arg("model"), py::arg("per_stream"),
        py::arg("how") = "sum");
  m.def("query_heads_to_streams", &QueryHeadsToStreamsPy, py::arg("model"),
        py::arg("per_query_head"), py::arg("how") = "sum");
  m.def(
      "kv_head_of_query_head",
      [](const Model& model, uint32_t q) { return KvHeadOfQueryHead(model.geometry(), q); },
      py::arg("model"), py::arg("query_head"));
}

}  // namespace cxltier::python
