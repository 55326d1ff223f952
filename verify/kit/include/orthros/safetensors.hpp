/// \file safetensors.hpp
/// \brief Reader/writer for `.safetensors` tensor files (SPEC §5), the format in which the
/// oracle exchanges cases and results with ports in PyTorch, JAX, NumPy or C++.
///
/// File layout (Hugging Face safetensors):
///   - 8 bytes: `N`, the header length, unsigned 64-bit little-endian;
///   - `N` bytes: a UTF-8 JSON object. Each key except `__metadata__` names a tensor:
///     `{"dtype": "F32", "shape": [2, 3], "data_offsets": [begin, end]}`, offsets in bytes
///     relative to the start of the data section. `__metadata__` (optional) maps strings
///     to strings;
///   - the data section: raw little-endian, C-contiguous (row-major) element data.
///
/// Supported dtypes: F64, F32, F16 (IEEE binary16) and BF16 (bfloat16). Other dtypes of the
/// format (BOOL, U8, I8, I16, U16, I32, U32, I64, U64, F8_E4M3, F8_E5M2, ...) are rejected
/// with an error naming them.
///
/// Choices where the format leaves room (documented here, tested in verify/io/):
///   - Reading is strict about everything that could make data ambiguous: offsets must lie
///     inside the data section, `end - begin` must equal `product(shape) * element size`,
///     and two tensors with non-zero size must not overlap. Gaps between tensors and
///     unused trailing bytes are accepted (they cannot change any tensor's value).
///   - Writing is deterministic: tensors in sorted name order, packed back to back from
///     offset 0; header keys sorted; the header is padded with spaces so the data section
///     starts at a multiple of 8 bytes (the format allows trailing JSON whitespace).
///     Identical `File`s therefore give identical bytes.
///   - Conversions to a narrower type (`from_matrix`, or `to_matrix` into a narrower
///     scalar) round to nearest, ties to even, directly from the exact value (no double
///     rounding through float); values beyond the target's range become ±inf, NaN stays NaN.
#pragma once

#include "orthros/tensor.hpp"

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace orthros::st {

/// Element type of a tensor in the file (the safetensors dtype string is the enumerator name).
enum class DType { F64, F32, F16, BF16 };

/// Size of one element in bytes: 8, 4, 2, 2.
std::size_t dtype_size(DType t);
/// The safetensors dtype string: "F64", "F32", "F16", "BF16".
const char* dtype_string(DType t);
/// Parses a safetensors dtype string. \throws orthros::Error for other format dtypes
/// ("dtype I32 is not supported ...") and for strings that are no safetensors dtype.
DType parse_dtype(const std::string& s);

/// One tensor: dtype, shape (C order, outermost first) and raw little-endian element bytes.
/// Invariant (checked by write_file/serialize): `data.size() == product(shape) * dtype_size(dtype)`.
struct Tensor {
  DType dtype = DType::F64;        ///< element type
  std::vector<std::int64_t> shape; ///< dims, each >= 0; empty = scalar (1 element)
  std::vector<std::uint8_t> data;  ///< product(shape) * dtype_size(dtype) bytes, little-endian
  /// Number of elements: product of the shape (1 for a scalar).
  std::int64_t numel() const;
};

/// A whole file: named tensors plus the string->string `__metadata__` map.
struct File {
  std::map<std::string, Tensor> tensors;            ///< tensor name -> tensor
  std::map<std::string, std::string> metadata;      ///< `__metadata__` entries
};

/// Parses the bytes of a safetensors file.
/// \throws orthros::Error (one line, naming the tensor/field) on: fewer than 8 bytes; a header
///   length larger than the file or than 100 MB; invalid JSON; a header that is not an object;
///   a tensor entry that is not an object or lacks `dtype`/`shape`/`data_offsets`; an unknown or
///   unsupported dtype; a shape that is not an array of integers >= 0 or whose element count
///   overflows; `data_offsets` that are not two integers with begin <= end inside the data
///   section; `end - begin != product(shape) * element size`; two overlapping non-empty
///   tensors; `__metadata__` that is not an object of strings; a tensor named `__metadata__`.
File parse(const std::vector<std::uint8_t>& bytes);

/// Reads and parses `path` (see parse()). \throws orthros::Error naming the path when the
/// file is missing, not a regular file (require_regular_file(): checked before it is opened, so
/// a FIFO or a device such as /dev/zero is rejected instead of blocking or reading forever) or
/// unreadable, and everything parse() throws (prefixed with the path).
File read_file(const std::string& path);

/// Checks, without opening it, that `path` names a regular file (or a symbolic link to one).
/// `what` names the expected kind of file for the message, e.g. "a .safetensors file".
/// \throws orthros::Error `cannot open "<path>": no such file` when nothing is there, and
///   `"<path>" is a directory|a FIFO (named pipe)|a character device|a block device|a socket,
///   not <what>` for anything else.
void require_regular_file(const std::string& path, const std::string& what);

/// Serializes `f` to safetensors bytes, deterministically (see the file comment).
/// \throws orthros::Error if a tensor's data size does not match its shape/dtype, a dim is
///   negative, or a tensor is named `__metadata__` or "".
std::vector<std::uint8_t> serialize(const File& f);

/// Writes serialize(f) to `path` (overwriting). \throws orthros::Error if it cannot be written.
void write_file(const std::string& path, const File& f);

/// Rounds an exact double value to scalar type S, to nearest with ties to even, directly
/// (no intermediate float rounding for bf16/f16). Overflow gives ±inf; NaN stays NaN.
/// S is one of double, float, Eigen::bfloat16, Eigen::half. Same as orthros::round_rne<S>
/// (tensor.hpp), the project's single narrowing rule, which it calls.
template <typename S>
S round_to(double x);
/// \cond SPECIALIZATIONS
template <>
double round_to<double>(double x);
template <>
float round_to<float>(double x);
template <>
Eigen::bfloat16 round_to<Eigen::bfloat16>(double x);
template <>
Eigen::half round_to<Eigen::half>(double x);
/// \endcond

/// Element `i` of `t`, widened exactly to double. Precondition: `0 <= i < t.numel()`.
double element(const Tensor& t, std::int64_t i);

/// Converts tensor `t` (any supported dtype) to a row-major matrix of scalar type S:
/// rows = shape[0], cols = product of shape[1:]. So a `[T, H, D]` tensor becomes the
/// `[T, H*D]` layout of orthros::Mat; a rank-1 `[n]` tensor becomes an n x 1 column;
/// a scalar (rank 0) becomes 1 x 1. Widening is exact; narrowing rounds as round_to().
/// \param t    the tensor (shape and data consistent, as parse() guarantees)
/// \param name used in error messages.
/// \throws orthros::Error if rows/cols do not fit Eigen::Index or the data size is inconsistent.
template <typename S>
Mat<S> to_matrix(const Tensor& t, const std::string& name);

/// Makes a tensor of dtype `dtype` and shape `shape` from matrix `m` (row-major element order),
/// rounding each element to `dtype` as round_to() does.
/// \throws orthros::Error if product(shape) != m.size() or a dim is negative.
template <typename S>
Tensor from_matrix(const Mat<S>& m, std::vector<std::int64_t> shape, DType dtype);

/// Convenience: shape as text, e.g. "[2, 3, 4]" (for error messages).
std::string shape_string(const std::vector<std::int64_t>& shape);

}  // namespace orthros::st
