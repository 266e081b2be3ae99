// Runs the inference forward of an exported tvmrnn package (CPU) on inputs read from files.
//
//   run_forward <package.so> <T> <input dir> <output dir>
//
// <input dir> holds raw little-endian float32 files: params.f32 (every parameter in PyTorch's
// order and layout, flattened and concatenated, as the metadata's "parameters" lists), x.f32,
// and optionally h0.f32 and c0.f32 (zeros when absent). Writes y.f32, hy.f32 (and cy.f32).
// Everything it needs to know (shapes, argument order) comes from the package's own metadata.
// The files hold the package's batch_size rows; where its kernels were built for more
// ("compiled_rows": a CPU batch padded to fuller register tiles), the rows are padded with zeros
// on the way in and cut back on the way out.
#include <dlpack/dlpack.h>
#include <tvm/ffi/container/tensor.h>
#include <tvm/ffi/extra/json.h>
#include <tvm/ffi/extra/module.h>
#include <tvm/ffi/function.h>

#include <algorithm>
#include <cstdint>
#include <fstream>
#include <iostream>
#include <map>
#include <stdexcept>
#include <string>
#include <vector>

namespace ffi = tvm::ffi;
namespace json = tvm::ffi::json;

struct Array {
  std::vector<int64_t> shape;
  std::vector<float> data;
  DLTensor tensor{};
  void Bind() {
    tensor.data = data.data();
    tensor.device = DLDevice{kDLCPU, 0};
    tensor.ndim = static_cast<int32_t>(shape.size());
    tensor.dtype = DLDataType{kDLFloat, 32, 1};
    tensor.shape = shape.data();
    tensor.strides = nullptr;
    tensor.byte_offset = 0;
  }
};

static void Read(const std::string& path, std::vector<float>* out, bool required) {
  std::ifstream f(path, std::ios::binary | std::ios::ate);
  if (!f) {
    if (required) throw std::runtime_error("cannot read " + path);
    return;  // optional input: stays zeros
  }
  size_t bytes = static_cast<size_t>(f.tellg());
  if (bytes != out->size() * sizeof(float)) {
    throw std::runtime_error(path + ": expected " + std::to_string(out->size()) + " floats, got " +
                             std::to_string(bytes / sizeof(float)));
  }
  f.seekg(0);
  f.read(reinterpret_cast<char*>(out->data()), static_cast<std::streamsize>(bytes));
}

static void Write(const std::string& path, const std::vector<float>& data) {
  std::ofstream f(path, std::ios::binary);
  f.write(reinterpret_cast<const char*>(data.data()), static_cast<std::streamsize>(data.size() * sizeof(float)));
  if (!f) throw std::runtime_error("cannot write " + path);
}

// Allocate every argument of a pass from its signature: dimension i is a*T + b.
static std::vector<std::pair<std::string, Array>> Arguments(const json::Object& meta, const char* pass, int64_t T) {
  std::vector<std::pair<std::string, Array>> args;
  json::Array signature = meta.at("signatures").cast<json::Object>().at(pass).cast<json::Array>();
  for (const ffi::Any& entry : signature) {
    json::Array arg = entry.cast<json::Array>();
    Array a;
    size_t size = 1;
    for (const ffi::Any& dim : arg[1].cast<json::Array>()) {
      json::Array ab = dim.cast<json::Array>();
      a.shape.push_back(ab[0].cast<int64_t>() * T + ab[1].cast<int64_t>());
      size *= static_cast<size_t>(a.shape.back());
    }
    a.data.assign(size, 0.0f);
    args.emplace_back(std::string(arg[0].cast<ffi::String>()), std::move(a));
  }
  return args;
}

static void Call(ffi::Module& mod, const char* pass, std::vector<std::pair<std::string, Array>>& args) {
  std::vector<ffi::AnyView> views;
  for (auto& [name, a] : args) {
    a.Bind();
    views.emplace_back(&a.tensor);
  }
  ffi::Function f = mod->GetFunction(pass).value();
  ffi::Any result;
  f.CallPacked(views.data(), static_cast<int32_t>(views.size()), &result);
}

// Rows along axis `axis` of an array shaped `shape` (the pass's, `rows` there): `from` rows in,
// `to` rows out, zeros for the rows added (from < to) or rows dropped (from > to).
static std::vector<float> Resize(const std::vector<float>& src, const std::vector<int64_t>& shape, size_t axis,
                                 int64_t from, int64_t to) {
  int64_t outer = 1, inner = 1;
  for (size_t i = 0; i < axis; ++i) outer *= shape[i];
  for (size_t i = axis + 1; i < shape.size(); ++i) inner *= shape[i];
  std::vector<float> dst(static_cast<size_t>(outer * to * inner), 0.0f);
  int64_t keep = std::min(from, to);
  for (int64_t o = 0; o < outer; ++o) {
    std::copy_n(src.begin() + o * from * inner, keep * inner, dst.begin() + o * to * inner);
  }
  return dst;
}

// Read a file of `batch` rows into `a` (its batch axis `axis`, the pass's rows).
static void ReadRows(const std::string& path, Array* a, size_t axis, int64_t batch, bool required) {
  int64_t rows = a->shape[axis];
  std::vector<float> file(a->data.size() / static_cast<size_t>(rows) * static_cast<size_t>(batch), 0.0f);
  std::ifstream probe(path);
  if (!probe && !required) return;  // optional input: stays zeros
  Read(path, &file, required);
  a->data = Resize(file, a->shape, axis, batch, rows);
}

// Write `a`'s first `batch` rows (its batch axis `axis`).
static void WriteRows(const std::string& path, const Array& a, size_t axis, int64_t batch) {
  Write(path, Resize(a.data, a.shape, axis, a.shape[axis], batch));
}

static Array& Find(std::vector<std::pair<std::string, Array>>& args, const std::string& name) {
  for (auto& [n, a] : args) if (n == name) return a;
  throw std::runtime_error("no argument " + name);
}

int main(int argc, char** argv) {
  if (argc != 5) {
    std::cerr << "usage: run_forward <package.so> <T> <input dir> <output dir>\n";
    return 2;
  }
  try {
    // a bare file name is the current folder's (dlopen would search the library path for it)
    std::string path = argv[1];
    if (path.find('/') == std::string::npos) path = "./" + path;
    ffi::Module mod = ffi::Module::LoadFromFile(path);
    auto metadata = mod->GetFunction("tvmrnn_metadata");
    if (!metadata.has_value()) throw std::runtime_error(std::string(argv[1]) + " is not a tvmrnn package");
    json::Object meta = json::Parse((*metadata)().cast<ffi::String>()).cast<json::Object>();
    if (meta.at("target_kind").cast<ffi::String>() != "llvm") throw std::runtime_error("this example runs CPU packages");
    int64_t T = std::stoll(argv[2]);
    std::string in = argv[3], out = argv[4];

    auto pack = Arguments(meta, "pack_weights", T);
    Read(in + "/params.f32", &Find(pack, "params").data, true);
    Call(mod, "pack_weights", pack);

    auto fwd = Arguments(meta, "forward", T);
    Find(fwd, "w").data = Find(pack, "w").data;
    int64_t batch = meta.at("batch_size").cast<int64_t>();
    size_t seq_axis = meta.at("batch_first").cast<bool>() ? 0 : 1;  // x and y: (T, N, .) or (N, T, .)
    ReadRows(in + "/x.f32", &Find(fwd, "x"), seq_axis, batch, true);
    ReadRows(in + "/h0.f32", &Find(fwd, "h0"), 1, batch, false);  // states: (layers x directions, N, H)
    bool has_c = meta.at("has_cell_state").cast<bool>();
    if (has_c) ReadRows(in + "/c0.f32", &Find(fwd, "c0"), 1, batch, false);
    for (auto& [name, a] : fwd) {  // a variable-lengths package: every row runs all T steps
      if (name == "mask") a.data.assign(a.data.size(), 1.0f);
    }
    Call(mod, "forward", fwd);

    WriteRows(out + "/y.f32", Find(fwd, "y"), seq_axis, batch);
    WriteRows(out + "/hy.f32", Find(fwd, "hy"), 1, batch);
    if (has_c) WriteRows(out + "/cy.f32", Find(fwd, "cy"), 1, batch);
    std::cout << "ran " << std::string(meta.at("cell").cast<ffi::String>()) << " forward, T=" << T << "\n";
  } catch (const std::exception& e) {
    std::cerr << "error: " << e.what() << "\n";
    return 1;
  }
  return 0;
}
