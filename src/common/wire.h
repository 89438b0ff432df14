// wire.h: the compact binary encoding of DYAD messages.
//
// Integers are little-endian and fixed width; strings and byte blobs are a
// u32 length followed by the bytes. Decoding never reads past the buffer:
// any shortfall latches the decoder into a failed state, which callers turn
// into DYAD_RC_BADUNPACK. Not thread-safe; one encoder/decoder per message.
#pragma once

#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>

namespace dyad {

class Encoder {
 public:
  Encoder& U8(uint8_t v) { return Raw(&v, 1); }
  Encoder& U16(uint16_t v) { return Raw(&v, 2); }
  Encoder& U32(uint32_t v) { return Raw(&v, 4); }
  Encoder& U64(uint64_t v) { return Raw(&v, 8); }
  Encoder& I32(int32_t v) { return Raw(&v, 4); }
  Encoder& I64(int64_t v) { return Raw(&v, 8); }
  Encoder& Bool(bool v) { return U8(v ? 1 : 0); }
  Encoder& Str(std::string_view s) {
    U32(static_cast<uint32_t>(s.size()));
    buf_.append(s.data(), s.size());
    return *this;
  }
  const std::string& data() const { return buf_; }
  std::string Take() { return std::move(buf_); }

 private:
  Encoder& Raw(const void* p, size_t n) {
    buf_.append(static_cast<const char*>(p), n);
    return *this;
  }
  std::string buf_;
};

class Decoder {
 public:
  explicit Decoder(std::string_view data) : data_(data) {}

  uint8_t U8() { return Fixed<uint8_t>(); }
  uint16_t U16() { return Fixed<uint16_t>(); }
  uint32_t U32() { return Fixed<uint32_t>(); }
  uint64_t U64() { return Fixed<uint64_t>(); }
  int32_t I32() { return Fixed<int32_t>(); }
  int64_t I64() { return Fixed<int64_t>(); }
  bool Bool() { return U8() != 0; }
  std::string Str(size_t max_len = 1u << 20) {
    const uint32_t n = U32();
    if (failed_ || n > max_len || n > data_.size() - pos_) {
      failed_ = true;
      return {};
    }
    std::string s(data_.substr(pos_, n));
    pos_ += n;
    return s;
  }
  // True when every field decoded and nothing is left over.
  bool done() const { return !failed_ && pos_ == data_.size(); }
  bool failed() const { return failed_; }

 private:
  template <typename T>
  T Fixed() {
    T v{};
    if (failed_ || data_.size() - pos_ < sizeof(T)) {
      failed_ = true;
      return v;
    }
    std::memcpy(&v, data_.data() + pos_, sizeof(T));
    pos_ += sizeof(T);
    return v;
  }
  std::string_view data_;
  size_t pos_ = 0;
  bool failed_ = false;
};

}  // namespace dyad
