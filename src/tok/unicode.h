// UTF-8 helpers and the GPT-2 byte <-> unicode mapping used by byte-level BPE.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace pagoda::tok {

// Length in bytes of the well-formed UTF-8 sequence starting at s[pos] (RFC 3629:
// no overlongs, no surrogates, at most U+10FFFF), or 0 if the bytes there are not
// one. Precondition: pos < s.size().
size_t utf8_valid_len(std::string_view s, size_t pos);

// Number of bytes at the end of s that form the start of a well-formed multi-byte
// sequence still missing continuation bytes (0..3). Such a tail may become valid
// when more bytes arrive; a streaming decoder holds it back.
size_t utf8_incomplete_tail(std::string_view s);

// Appends code point cp encoded as UTF-8. Precondition: cp <= 0x10FFFF.
void append_utf8(std::string& out, uint32_t cp);

// Decodes the code point of a well-formed sequence of length len at s[pos].
uint32_t utf8_decode(std::string_view s, size_t pos, size_t len);

// Copies s, replacing every byte sequence that is not well-formed UTF-8 by U+FFFD
// (one replacement per maximal invalid subpart is not attempted: one per byte).
std::string utf8_sanitize(std::string_view s);

// GPT-2 byte-level mapping: every byte value maps to a printable code point
// (bytes 0x21-0x7E, 0xA1-0xAC, 0xAE-0xFF map to themselves, the rest to U+0100+).
// byte_to_unicode(b) is the UTF-8 encoding of that code point.
const std::string& byte_to_unicode(uint8_t b);
// Inverse mapping; returns -1 for a code point that is not the image of a byte.
int unicode_to_byte(uint32_t cp);

}  // namespace pagoda::tok
