// Criteo TSV -> rows: the hot loop of `dlac preprocess criteo` and of CriteoTSVDataModule (lightning_dlac/criteo/).
//
// A plain pybind11 module, not a torch op: it parses bytes into caller-owned numpy buffers and releases the GIL,
// so the Python driver (lightning_dlac/criteo/parser.py) runs one thread per byte range of the input (--workers).
// The pure-Python parser in lightning_dlac/criteo/spec.py is the specification; this file must accept and reject
// exactly the same lines and produce the same values (tests/test_preprocess.py holds them to it). It is built and
// loaded by lightning_dlac/native/build.py, the codec's build helper.
//
// A line is the bytes before '\n' (a trailing '\r' is dropped): 40 tab-separated fields.
//   label        exactly "0" or "1"
//   13 integers  empty (-> 0) or [+-]?[0-9]+ within int32
//   26 hex       empty (-> 0) or [0-9a-fA-F]+ below 2**63 (TorchRec keeps them as int64)
// Lives beside its Python specification (lightning_dlac/criteo/spec.py), not in cuda_ext/, which holds the codec.

#include <pybind11/pybind11.h>

#include <algorithm>
#include <climits>
#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <string>

namespace py = pybind11;

namespace {

constexpr int kDense = 13;
constexpr int kSparse = 26;
constexpr int kFields = 1 + kDense + kSparse;

// Error codes shared with lightning_dlac/criteo/spec.py (ERR_*).
enum Err : int {
  kOk = 0,
  kFieldCount = 1,
  kLabel = 2,
  kDenseNotInt = 3,
  kDenseRange = 4,
  kSparseNotHex = 5,
  kSparseRange = 6,
};

inline int hex_value(unsigned char c) {
  if (c >= '0' && c <= '9') return c - '0';
  c |= 0x20;  // maps 'A'-'F' onto 'a'-'f'; no other byte lands in that range
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  return -1;
}

// Parse one integer field [q, end): empty -> 0. Returns kOk, kDenseNotInt or kDenseRange (a field that is both
// too long and malformed is "not an integer", as in the Python specification).
inline int parse_dense(const char* q, const char* end, int32_t* out) {
  bool neg = false;
  if (q < end && (*q == '-' || *q == '+')) {
    neg = *q == '-';
    ++q;
    if (q == end) return kDenseNotInt;  // a bare sign is not a number (Python's int("-") fails too)
  }
  uint64_t v = 0;
  bool overflow = false;
  for (; q < end; ++q) {
    unsigned d = static_cast<unsigned char>(*q) - '0';
    if (d > 9) return kDenseNotInt;
    v = v * 10 + d;
    if (v > 2147483648ULL) {  // clamp so v never wraps; leading zeros keep v small and are fine
      overflow = true;
      v = 2147483649ULL;
    }
  }
  if (overflow || (!neg && v > 2147483647ULL)) return kDenseRange;
  *out = neg ? static_cast<int32_t>(-static_cast<int64_t>(v)) : static_cast<int32_t>(v);
  return kOk;
}

inline int parse_hex(const char* q, const char* end, int64_t* out) {
  uint64_t v = 0;
  bool overflow = false;
  for (; q < end; ++q) {
    int h = hex_value(static_cast<unsigned char>(*q));
    if (h < 0) return kSparseNotHex;
    if (v >> 59) overflow = true;  // v * 16 + h would reach 2**63
    v = (v << 4) | static_cast<uint64_t>(h);
  }
  if (overflow) return kSparseRange;
  *out = static_cast<int64_t>(v);
  return kOk;
}

// Parse line [p, e). On failure returns the error code and sets *field (0-based) or *nfields (kFieldCount).
int parse_line(const char* p, const char* e, int32_t* dense, int64_t* sparse, int32_t* label, int* field,
               int* nfields) {
  const char* starts[kFields + 1];
  int n = 0;
  starts[n++] = p;
  for (const char* q = p; q < e; ++q) {
    if (*q == '\t') {
      if (n == kFields) {  // too many: count the rest for the message
        int extra = 1;
        for (const char* r = q + 1; r < e; ++r) extra += *r == '\t';
        *nfields = kFields + extra;
        return kFieldCount;
      }
      starts[n++] = q + 1;
    }
  }
  if (n != kFields) {
    *nfields = n;
    return kFieldCount;
  }
  starts[kFields] = e + 1;  // every field ends one byte before the next one starts
  const char* f0 = starts[0];
  if (starts[1] - 1 - f0 != 1 || (*f0 != '0' && *f0 != '1')) {
    *field = 0;
    return kLabel;
  }
  *label = *f0 - '0';
  for (int k = 0; k < kDense; ++k) {
    int rc = parse_dense(starts[1 + k], starts[2 + k] - 1, dense + k);
    if (rc != kOk) {
      *field = 1 + k;
      return rc;
    }
  }
  for (int k = 0; k < kSparse; ++k) {
    int rc = parse_hex(starts[1 + kDense + k], starts[2 + kDense + k] - 1, sparse + k);
    if (rc != kOk) {
      *field = 1 + kDense + k;
      return rc;
    }
  }
  return kOk;
}

// 256-entry hex digit table (-1: not a hex digit), for the fast path.
struct HexTable {
  int8_t v[256];
  constexpr HexTable() : v() {
    for (int c = 0; c < 256; ++c) v[c] = -1;
    for (int c = '0'; c <= '9'; ++c) v[c] = static_cast<int8_t>(c - '0');
    for (int c = 'a'; c <= 'f'; ++c) v[c] = static_cast<int8_t>(c - 'a' + 10);
    for (int c = 'A'; c <= 'F'; ++c) v[c] = static_cast<int8_t>(c - 'A' + 10);
  }
};
constexpr HexTable kHex;

// One pass over the line starting at q, in a buffer ending at `end`, when it is well formed in the common way
// (integers of at most 9 digits, hex of at most 15): writes the row, folds its dense minimum into *dmin and returns
// where the next line starts. Returns nullptr for anything else (including a line that runs into the end of the
// buffer, unless `final`), which the caller then hands to parse_line: it accepts the rare valid lines this skips
// (long zero-padded numbers, 16-digit hex, a lone '\r' at the very end) and names the error otherwise. No separate
// scan for the newline, and Criteo's usual 8-digit hex in one branch-free step: about 3x parse_line's speed.
inline const char* fast_line(const char* q, const char* end, bool final, int32_t* dense, int64_t* sparse,
                             int32_t* label, int32_t* dmin) {
  if (end - q < kFields) return nullptr;
  if ((q[0] != '0' && q[0] != '1') || q[1] != '\t') return nullptr;
  *label = q[0] - '0';
  q += 2;
  int32_t lo = INT32_MAX;  // folded into *dmin only if the whole line parses
  for (int k = 0; k < kDense; ++k) {
    const bool sign = q < end && (*q == '-' || *q == '+');
    const bool neg = sign && *q == '-';
    q += sign;
    const char* first = q;
    int32_t v = 0;
    while (q < end) {
      unsigned d = static_cast<unsigned char>(*q) - '0';
      if (d > 9) break;
      v = v * 10 + static_cast<int32_t>(d);
      ++q;
    }
    const auto digits = q - first;
    // Nine digits always fit in int32; a bare sign is not a number.
    if (digits > 9 || (sign && digits == 0) || q >= end || *q != '\t') return nullptr;
    v = neg ? -v : v;
    dense[k] = v;
    lo = std::min(lo, v);
    ++q;
  }
  for (int k = 0; k < kSparse; ++k) {
    uint64_t v = 0;
    if (end - q > 8) {
      // Eight table lookups without a branch per byte; any non-hex byte makes the OR negative.
      const auto* u = reinterpret_cast<const unsigned char*>(q);
      const int8_t h0 = kHex.v[u[0]], h1 = kHex.v[u[1]], h2 = kHex.v[u[2]], h3 = kHex.v[u[3]];
      const int8_t h4 = kHex.v[u[4]], h5 = kHex.v[u[5]], h6 = kHex.v[u[6]], h7 = kHex.v[u[7]];
      if ((h0 | h1 | h2 | h3 | h4 | h5 | h6 | h7) >= 0 && kHex.v[u[8]] < 0) {
        v = (uint64_t(h0) << 28) | (uint64_t(h1) << 24) | (uint64_t(h2) << 20) | (uint64_t(h3) << 16) |
            (uint64_t(h4) << 12) | (uint64_t(h5) << 8) | (uint64_t(h6) << 4) | uint64_t(h7);
        q += 8;
        goto separator;
      }
    }
    {
      const char* first = q;
      while (q < end) {
        int h = kHex.v[static_cast<unsigned char>(*q)];
        if (h < 0) break;
        v = (v << 4) | static_cast<uint64_t>(h);
        ++q;
      }
      if (q - first > 15) return nullptr;
    }
  separator:
    sparse[k] = static_cast<int64_t>(v);
    if (k + 1 < kSparse) {
      if (q >= end || *q != '\t') return nullptr;
      ++q;
    } else if (q < end && *q == '\n') {
      ++q;
    } else if (q + 1 < end && q[0] == '\r' && q[1] == '\n') {
      q += 2;
    } else if (!(q == end && final)) {
      return nullptr;
    }
  }
  *dmin = std::min(*dmin, lo);
  return q;
}

template <typename T>
T* writable_rows(const py::buffer_info& info, const char* name, py::ssize_t cols) {
  if (info.readonly) throw std::invalid_argument(std::string(name) + " must be writable");
  // Signed integers of sizeof(T) bytes: numpy reports int64 as 'l' where pybind11 spells it 'q', so compare the kind
  // and the size rather than the exact format string.
  const char kind = info.format.empty() ? '?' : info.format.back();
  if (info.itemsize != static_cast<py::ssize_t>(sizeof(T)) || std::strchr("bhilq", kind) == nullptr)
    throw std::invalid_argument(std::string(name) + " has the wrong dtype");
  if (info.ndim != 2 || info.shape[1] != cols || info.strides[1] != info.itemsize ||
      info.strides[0] != cols * info.itemsize)
    throw std::invalid_argument(std::string(name) + " must be a C-contiguous [rows, " + std::to_string(cols) +
                                "] array");
  return static_cast<T*>(info.ptr);
}

// Count '\n' in the first `length` bytes of `data`.
int64_t count_lines(const py::buffer& data, int64_t length) {
  py::buffer_info in = data.request();
  if (length < 0 || length > in.size * in.itemsize) throw std::invalid_argument("length exceeds the buffer");
  const char* p = static_cast<const char*>(in.ptr);
  const char* e = p + length;
  int64_t n = 0;
  py::gil_scoped_release release;
  while (p < e) {
    const void* hit = std::memchr(p, '\n', static_cast<size_t>(e - p));
    if (hit == nullptr) break;
    ++n;
    p = static_cast<const char*>(hit) + 1;
  }
  return n;
}

// Parse the lines in data[0:length] into the row buffers, starting at row 0.
//
// Only lines ended by '\n' are parsed unless `final` (then a last unterminated line counts too); parsing also stops
// when the row buffers are full or at the first bad line unless `skip_bad`. Returns
// (rows, lines, consumed_bytes, bad_lines, dense_min, err_code, err_line, err_field, err_nfields, err_offset,
//  err_length): `lines` counts every line consumed (bad ones included), `err_line` is the index of the first bad line
// among them (-1 if none), `err_offset`/`err_length` its bytes in `data`.
py::tuple parse(const py::buffer& data, int64_t length, const py::buffer& dense_buf, const py::buffer& sparse_buf,
                const py::buffer& labels_buf, bool skip_bad, bool final) {
  py::buffer_info in = data.request();
  if (length < 0 || length > in.size * in.itemsize) throw std::invalid_argument("length exceeds the buffer");
  py::buffer_info di = dense_buf.request(true), si = sparse_buf.request(true), li = labels_buf.request(true);
  int32_t* dense = writable_rows<int32_t>(di, "dense", kDense);
  int64_t* sparse = writable_rows<int64_t>(si, "sparse", kSparse);
  int32_t* labels = writable_rows<int32_t>(li, "labels", 1);
  const int64_t capacity = std::min({di.shape[0], si.shape[0], li.shape[0]});

  const char* base = static_cast<const char*>(in.ptr);
  const char* p = base;
  const char* end = base + length;
  int64_t rows = 0, lines = 0, bad = 0;
  int32_t dmin = INT32_MAX;
  int err = kOk, err_field = -1, err_nfields = -1;
  int64_t err_line = -1, err_offset = -1, err_length = 0;
  {
    py::gil_scoped_release release;
    while (p < end && rows < capacity) {
      if (const char* next = fast_line(p, end, final, dense + rows * kDense, sparse + rows * kSparse, labels + rows,
                                       &dmin)) {
        ++rows;
        ++lines;
        p = next;
        continue;
      }
      const char* nl = static_cast<const char*>(std::memchr(p, '\n', static_cast<size_t>(end - p)));
      if (nl == nullptr && !final) break;
      const char* e = nl ? nl : end;
      const char* le = (e > p && e[-1] == '\r') ? e - 1 : e;
      int field = -1, nfields = -1;
      int32_t* d = dense + rows * kDense;
      const int rc = parse_line(p, le, d, sparse + rows * kSparse, labels + rows, &field, &nfields);
      if (rc == kOk)
        for (int k = 0; k < kDense; ++k) dmin = std::min(dmin, d[k]);
      if (rc == kOk) {
        ++rows;
      } else {
        if (err_line < 0) {
          err = rc;
          err_field = field;
          err_nfields = nfields;
          err_line = lines;
          err_offset = p - base;
          err_length = le - p;
        }
        if (!skip_bad) break;  // the bad line is not consumed: `lines` stays its index
        ++bad;
      }
      ++lines;
      p = nl ? nl + 1 : end;
    }
  }
  return py::make_tuple(rows, lines, static_cast<int64_t>(p - base), bad, dmin, err, err_line, err_field,
                        err_nfields, err_offset, err_length);
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() = "Criteo TSV parser for `dlac preprocess criteo` (see lightning_dlac/criteo/spec.py)";
  m.def("count_lines", &count_lines, "Count newlines in the first `length` bytes of a buffer (GIL released).",
        py::arg("data"), py::arg("length"));
  m.def("parse", &parse, "Parse Criteo TSV lines into dense/sparse/labels row buffers (GIL released).",
        py::arg("data"), py::arg("length"), py::arg("dense"), py::arg("sparse"), py::arg("labels"),
        py::arg("skip_bad"), py::arg("final"));
}
