// safetensors reader/writer (SPEC §5). See orthros/safetensors.hpp for the format and choices.
#include "orthros/safetensors.hpp"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <set>
#include <limits>
#include <sstream>

namespace orthros::st {
namespace {

using detail::cat;
using json = nlohmann::json;

constexpr std::uint64_t kMaxHeader = 100ull * 1000 * 1000;  // 100 MB: larger is rejected as absurd

std::uint64_t load_le(const std::uint8_t* p, int nbytes) {
  std::uint64_t v = 0;
  for (int i = nbytes - 1; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}
void store_le(std::uint8_t* p, std::uint64_t v, int nbytes) {
  for (int i = 0; i < nbytes; ++i) p[i] = static_cast<std::uint8_t>(v >> (8 * i));
}

std::int64_t checked_product(const std::vector<std::int64_t>& shape, const std::string& what) {
  std::int64_t n = 1;
  // Plain ifs, not require(): its arguments (shape_string) would be built on every call, and
  // numel() runs per element in some readers' loops.
  for (std::int64_t d : shape) {
    if (d < 0) throw Error(cat(what, ": negative dimension ", d, " in shape ", shape_string(shape)));
    std::int64_t out = 0;
    if (__builtin_mul_overflow(n, d, &out))
      throw Error(cat(what, ": element count of shape ", shape_string(shape), " overflows"));
    n = out;
  }
  return n;
}

// Reads a JSON integer >= 0 (rejects floats, booleans, strings, negatives).
bool json_uint(const json& j, std::uint64_t& out) {
  if (j.is_number_unsigned()) {
    out = j.get<std::uint64_t>();
    return true;
  }
  if (j.is_number_integer() && j.get<std::int64_t>() >= 0) {
    out = static_cast<std::uint64_t>(j.get<std::int64_t>());
    return true;
  }
  return false;
}

}  // namespace

std::size_t dtype_size(DType t) {
  switch (t) {
    case DType::F64: return 8;
    case DType::F32: return 4;
    case DType::F16: return 2;
    case DType::BF16: return 2;
  }
  return 0;
}

const char* dtype_string(DType t) {
  switch (t) {
    case DType::F64: return "F64";
    case DType::F32: return "F32";
    case DType::F16: return "F16";
    case DType::BF16: return "BF16";
  }
  return "?";
}

DType parse_dtype(const std::string& s) {
  if (s == "F64") return DType::F64;
  if (s == "F32") return DType::F32;
  if (s == "F16") return DType::F16;
  if (s == "BF16") return DType::BF16;
  static const char* const other[] = {"BOOL", "U8",  "I8",  "I16", "U16",     "I32",     "U32",
                                      "I64",  "U64", "F8_E4M3", "F8_E5M2", "F8_E8M0", "F6_E2M3",
                                      "F6_E3M2", "F4", "C64", "C128"};
  for (const char* o : other)
    if (s == o) throw Error(cat("dtype ", s, " is not supported (supported: F64, F32, F16, BF16)"));
  throw Error(cat("unknown dtype \"", s, "\" (supported: F64, F32, F16, BF16)"));
}

std::int64_t Tensor::numel() const { return checked_product(shape, "tensor"); }

std::string shape_string(const std::vector<std::int64_t>& shape) {
  std::ostringstream os;
  os << '[';
  for (size_t i = 0; i < shape.size(); ++i) os << (i ? ", " : "") << shape[i];
  os << ']';
  return os.str();
}

File parse(const std::vector<std::uint8_t>& bytes) {
  require(bytes.size() >= 8, "file has ", bytes.size(),
          " bytes; a safetensors file needs at least 8 (the header length)");
  const std::uint64_t n = load_le(bytes.data(), 8);
  require(n <= kMaxHeader, "header length ", n, " bytes is absurd (limit ", kMaxHeader, ")");
  require(n <= bytes.size() - 8, "header length ", n, " bytes exceeds the file (", bytes.size() - 8,
          " bytes after the length field); file truncated or not safetensors");
  const char* hb = reinterpret_cast<const char*>(bytes.data() + 8);
  // nlohmann's lexer stops at a NUL byte; the format allows only JSON (+ trailing spaces).
  if (const void* nul = std::memchr(hb, 0, n))
    throw Error(cat("header is not valid JSON (NUL byte at header offset ", static_cast<const char*>(nul) - hb, ")"));
  require(!(n >= 3 && static_cast<unsigned char>(hb[0]) == 0xEF && static_cast<unsigned char>(hb[1]) == 0xBB &&
            static_cast<unsigned char>(hb[2]) == 0xBF),
          "header starts with a UTF-8 byte-order mark; it must start with the JSON object");
  // Duplicate keys would silently keep the last value: reject them (one key set per open object).
  std::vector<std::set<std::string>> keys;
  std::string duplicate;
  const json::parser_callback_t no_duplicates = [&](int, json::parse_event_t event, json& parsed) {
    if (event == json::parse_event_t::object_start) keys.emplace_back();
    if (event == json::parse_event_t::object_end && !keys.empty()) keys.pop_back();
    if (event == json::parse_event_t::key && !keys.empty() && !keys.back().insert(parsed.get<std::string>()).second &&
        duplicate.empty())
      duplicate = parsed.get<std::string>();
    return true;
  };
  json h = json::parse(hb, hb + n, no_duplicates, /*allow_exceptions=*/false);
  require(!h.is_discarded(), "header is not valid JSON");
  require(duplicate.empty(), "header repeats the key \"", duplicate, "\"");
  require(h.is_object(), "header must be a JSON object (got ", h.type_name(), ")");
  const std::uint64_t data_size = bytes.size() - 8 - n;
  const std::uint8_t* data = bytes.data() + 8 + n;

  File f;
  struct Span {
    std::uint64_t b, e;
    std::string name;
  };
  std::vector<Span> spans;
  for (auto it = h.begin(); it != h.end(); ++it) {
    const std::string& name = it.key();
    const json& e = it.value();
    if (name == "__metadata__") {
      require(e.is_object(), "__metadata__ must be an object of strings (got ", e.type_name(), ")");
      for (auto m = e.begin(); m != e.end(); ++m) {
        require(m.value().is_string(), "__metadata__ value of \"", m.key(), "\" must be a string (got ",
                m.value().type_name(), " ", m.value().dump(), ")");
        f.metadata[m.key()] = m.value().get<std::string>();
      }
      continue;
    }
    const std::string what = cat("tensor \"", name, "\"");
    require(e.is_object(), what, ": entry must be an object (got ", e.type_name(), ")");
    require(e.contains("dtype"), what, ": missing \"dtype\"");
    require(e.contains("shape"), what, ": missing \"shape\"");
    require(e.contains("data_offsets"), what, ": missing \"data_offsets\"");
    const json& jd = e["dtype"];
    require(jd.is_string(), what, ": \"dtype\" must be a string (got ", jd.dump(), ")");
    Tensor t;
    try {
      t.dtype = parse_dtype(jd.get<std::string>());
    } catch (const Error& err) {
      throw Error(cat(what, ": ", err.what()));
    }
    const json& js = e["shape"];
    require(js.is_array(), what, ": \"shape\" must be an array of integers (got ", js.dump(), ")");
    for (const json& d : js) {
      require(d.is_number_integer() || d.is_number_unsigned(), what, ": \"shape\" must be an array of integers (got ",
              js.dump(), ")");
      require(!(d.is_number_unsigned() && d.get<std::uint64_t>() > std::uint64_t(INT64_MAX)), what,
              ": dimension ", d.dump(), " is too large");
      const std::int64_t v = d.get<std::int64_t>();
      require(v >= 0, what, ": negative dimension ", v, " in shape ", js.dump());
      t.shape.push_back(v);
    }
    const std::int64_t numel = checked_product(t.shape, what);
    const json& jo = e["data_offsets"];
    std::uint64_t b = 0, en = 0;
    require(jo.is_array() && jo.size() == 2 && json_uint(jo[0], b) && json_uint(jo[1], en), what,
            ": \"data_offsets\" must be [begin, end], two integers >= 0 (got ", jo.dump(), ")");
    require(b <= en, what, ": data_offsets begin ", b, " > end ", en);
    require(en <= data_size, what, ": data_offsets [", b, ", ", en, "] outside the data section (", data_size,
            " bytes); file truncated?");
    std::uint64_t expect = 0;
    require(!__builtin_mul_overflow(static_cast<std::uint64_t>(numel), dtype_size(t.dtype), &expect), what,
            ": byte size of shape ", shape_string(t.shape), " overflows");
    require(en - b == expect, what, ": data_offsets [", b, ", ", en, "] span ", en - b, " bytes but ",
            dtype_string(t.dtype), " ", shape_string(t.shape), " needs ", expect);
    t.data.assign(data + b, data + en);
    if (en > b) spans.push_back({b, en, name});
    f.tensors.emplace(name, std::move(t));
  }
  std::sort(spans.begin(), spans.end(), [](const Span& x, const Span& y) { return x.b < y.b; });
  for (size_t i = 1; i < spans.size(); ++i)
    require(spans[i].b >= spans[i - 1].e, "tensors \"", spans[i - 1].name, "\" [", spans[i - 1].b, ", ",
            spans[i - 1].e, ") and \"", spans[i].name, "\" [", spans[i].b, ", ", spans[i].e, ") overlap");
  return f;
}

void require_regular_file(const std::string& path, const std::string& what) {
  namespace fs = std::filesystem;
  std::error_code ec;
  const fs::file_status s = fs::status(path, ec);  // stat(2): never opens, so never blocks
  if (s.type() == fs::file_type::not_found) throw Error(cat("cannot open \"", path, "\": no such file"));
  if (s.type() == fs::file_type::regular) return;
  const char* kind = "a special file";
  switch (s.type()) {
    case fs::file_type::directory: kind = "a directory"; break;
    case fs::file_type::fifo: kind = "a FIFO (named pipe)"; break;
    case fs::file_type::character: kind = "a character device"; break;
    case fs::file_type::block: kind = "a block device"; break;
    case fs::file_type::socket: kind = "a socket"; break;
    default:
      if (ec) throw Error(cat("cannot open \"", path, "\": ", ec.message()));
      break;
  }
  throw Error(cat("\"", path, "\" is ", kind, ", not ", what));
}

File read_file(const std::string& path) {
  require_regular_file(path, "a .safetensors file");
  std::ifstream in(path, std::ios::binary);
  require(static_cast<bool>(in), "cannot open \"", path, "\": ", std::strerror(errno));
  std::vector<std::uint8_t> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  require(!in.bad(), "cannot read \"", path, "\"");
  try {
    return parse(bytes);
  } catch (const Error& e) {
    throw Error(cat(path, ": ", e.what()));
  }
}

std::vector<std::uint8_t> serialize(const File& f) {
  json h = json::object();
  if (!f.metadata.empty()) {
    json m = json::object();
    for (const auto& [k, v] : f.metadata) m[k] = v;
    h["__metadata__"] = m;
  }
  std::uint64_t off = 0;
  for (const auto& [name, t] : f.tensors) {  // std::map: sorted names
    require(!name.empty() && name != "__metadata__", "invalid tensor name \"", name, "\"");
    const std::string what = cat("tensor \"", name, "\"");
    const std::int64_t numel = checked_product(t.shape, what);
    const std::uint64_t nbytes = static_cast<std::uint64_t>(numel) * dtype_size(t.dtype);
    require(t.data.size() == nbytes, what, ": has ", t.data.size(), " data bytes but ", dtype_string(t.dtype), " ",
            shape_string(t.shape), " needs ", nbytes);
    h[name] = json{{"dtype", dtype_string(t.dtype)}, {"shape", t.shape}, {"data_offsets", {off, off + nbytes}}};
    off += nbytes;
  }
  std::string hs = h.dump();  // nlohmann's object is a std::map: keys sorted, output deterministic
  while ((8 + hs.size()) % 8 != 0) hs.push_back(' ');
  std::vector<std::uint8_t> out(8 + hs.size());
  store_le(out.data(), hs.size(), 8);
  std::memcpy(out.data() + 8, hs.data(), hs.size());
  out.reserve(out.size() + off);
  for (const auto& [name, t] : f.tensors) out.insert(out.end(), t.data.begin(), t.data.end());
  return out;
}

void write_file(const std::string& path, const File& f) {
  const std::vector<std::uint8_t> bytes = serialize(f);
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  require(static_cast<bool>(out), "cannot write \"", path, "\": ", std::strerror(errno));
  out.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
  out.close();
  require(static_cast<bool>(out), "error while writing \"", path, "\"");
}

// The rounding itself lives in orthros/tensor.hpp (round_rne), shared with header-only users.
template <>
double round_to<double>(double x) {
  return round_rne<double>(x);
}
template <>
float round_to<float>(double x) {
  return round_rne<float>(x);
}
template <>
Eigen::bfloat16 round_to<Eigen::bfloat16>(double x) {
  return round_rne<Eigen::bfloat16>(x);
}
template <>
Eigen::half round_to<Eigen::half>(double x) {
  return round_rne<Eigen::half>(x);
}

double element(const Tensor& t, std::int64_t i) {
  const std::uint8_t* p = t.data.data() + static_cast<std::size_t>(i) * dtype_size(t.dtype);
  switch (t.dtype) {
    case DType::F64: {
      const std::uint64_t b = load_le(p, 8);
      double d;
      std::memcpy(&d, &b, 8);
      return d;
    }
    case DType::F32: {
      const std::uint32_t b = static_cast<std::uint32_t>(load_le(p, 4));
      float x;
      std::memcpy(&x, &b, 4);
      return x;
    }
    case DType::F16:
      return static_cast<double>(static_cast<float>(
          Eigen::numext::bit_cast<Eigen::half>(static_cast<std::uint16_t>(load_le(p, 2)))));
    case DType::BF16:
      return static_cast<double>(static_cast<float>(
          Eigen::numext::bit_cast<Eigen::bfloat16>(static_cast<std::uint16_t>(load_le(p, 2)))));
  }
  return 0.0;
}

template <typename S>
Mat<S> to_matrix(const Tensor& t, const std::string& name) {
  const std::string what = cat("tensor \"", name, "\"");
  const std::int64_t numel = checked_product(t.shape, what);
  require(t.data.size() == static_cast<std::uint64_t>(numel) * dtype_size(t.dtype), what, ": has ",
          t.data.size(), " data bytes, shape ", shape_string(t.shape), " needs ",
          static_cast<std::uint64_t>(numel) * dtype_size(t.dtype));
  const std::int64_t rows = t.shape.empty() ? 1 : t.shape[0];
  std::vector<std::int64_t> rest(t.shape.empty() ? t.shape.begin() : t.shape.begin() + 1, t.shape.end());
  const std::int64_t cols = checked_product(rest, what);
  Mat<S> m(rows, cols);
  S* out = m.data();
  for (std::int64_t i = 0; i < numel; ++i) out[i] = round_to<S>(element(t, i));
  return m;
}

template <typename S>
Tensor from_matrix(const Mat<S>& m, std::vector<std::int64_t> shape, DType dtype) {
  const std::int64_t numel = checked_product(shape, "from_matrix");
  require(numel == static_cast<std::int64_t>(m.size()), "from_matrix: shape ", shape_string(shape), " has ", numel,
          " elements but the matrix is ", m.rows(), " x ", m.cols(), " = ", m.size());
  Tensor t;
  t.dtype = dtype;
  t.shape = std::move(shape);
  const std::size_t es = dtype_size(dtype);
  t.data.resize(static_cast<std::size_t>(numel) * es);
  const S* in = m.data();  // row-major: C order of the [rows, ...] tensor
  for (std::int64_t i = 0; i < numel; ++i) {
    std::uint8_t* p = t.data.data() + static_cast<std::size_t>(i) * es;
    const double x = static_cast<double>(in[i]);  // exact widening
    switch (dtype) {
      case DType::F64: {
        std::uint64_t b;
        std::memcpy(&b, &x, 8);
        store_le(p, b, 8);
        break;
      }
      case DType::F32: {
        const float y = round_to<float>(x);
        std::uint32_t b;
        std::memcpy(&b, &y, 4);
        store_le(p, b, 4);
        break;
      }
      case DType::F16:
        store_le(p, Eigen::numext::bit_cast<std::uint16_t>(round_to<Eigen::half>(x)), 2);
        break;
      case DType::BF16:
        store_le(p, Eigen::numext::bit_cast<std::uint16_t>(round_to<Eigen::bfloat16>(x)), 2);
        break;
    }
  }
  return t;
}

#define ORTHROS_ST_INSTANTIATE(S)                                         \
  template Mat<S> to_matrix<S>(const Tensor&, const std::string&);        \
  template Tensor from_matrix<S>(const Mat<S>&, std::vector<std::int64_t>, DType);
ORTHROS_ST_INSTANTIATE(double)
ORTHROS_ST_INSTANTIATE(float)
ORTHROS_ST_INSTANTIATE(Eigen::bfloat16)
ORTHROS_ST_INSTANTIATE(Eigen::half)
#undef ORTHROS_ST_INSTANTIATE

}  // namespace orthros::st
