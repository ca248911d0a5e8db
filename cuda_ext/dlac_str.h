// Error messages without iostreams, for the code the CUDA build compiles (dlac_cuda.cu and the headers it
// includes): c10::str formats with std::ostringstream, and an ostream insertion instantiated in the nvcc-compiled
// object crashed the process (SIGSEGV in std::basic_ostream::_M_insert<long>, seen on the lent H200 with torch 2.11 /
// CUDA 13) instead of raising the check's error. dlac::str concatenates instead; TORCH_CHECK(cond, dlac::str(...))
// then hands c10 one std::string, which it uses as it is. Same text as the ostream would give for the types used
// here: integers in decimal, floats as %g, booleans as 1 / 0, a ScalarType by its name.
#pragma once

#include <c10/core/ScalarType.h>

#include <cstdio>
#include <string>
#include <type_traits>

namespace dlac {
namespace str_detail {

inline void put(std::string& s, const char* v) { s += v; }
inline void put(std::string& s, const std::string& v) { s += v; }
inline void put(std::string& s, char v) { s += v; }
inline void put(std::string& s, bool v) { s += v ? '1' : '0'; }
inline void put(std::string& s, c10::ScalarType v) { s += c10::toString(v); }
template <class T, std::enable_if_t<std::is_integral_v<T> && !std::is_same_v<T, bool> && !std::is_same_v<T, char>,
                                    int> = 0>
inline void put(std::string& s, T v) {
  s += std::to_string(v);
}
template <class T, std::enable_if_t<std::is_floating_point_v<T>, int> = 0>
inline void put(std::string& s, T v) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%g", double(v));
  s += buf;
}

}  // namespace str_detail

template <class... A>
std::string str(const A&... parts) {
  std::string s;
  (str_detail::put(s, parts), ...);
  return s;
}

}  // namespace dlac
