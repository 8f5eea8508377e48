#include "router/kv_wire.h"

#include <msgpuck.h>

#include <cstring>

namespace pagoda::router {
namespace {

// A cursor over a payload already validated by mp_check: every read below stays
// inside it; the type checks make a wrong shape an error instead of a misread.
struct Reader {
  const char* p;
  std::string err;

  bool fail(const std::string& what) {
    if (err.empty()) err = what;
    return false;
  }
  mp_type type() const { return mp_typeof(*p); }
  bool array(uint32_t* n, const char* what) {
    if (type() != MP_ARRAY) return fail(std::string(what) + " is not an array");
    *n = mp_decode_array(&p);
    return true;
  }
  bool u64(uint64_t* out, const char* what) {
    if (type() == MP_UINT) {
      *out = mp_decode_uint(&p);
      return true;
    }
    if (type() == MP_INT) {  // a negative int: its two's complement bits (Python's signed hashes)
      *out = static_cast<uint64_t>(mp_decode_int(&p));
      return true;
    }
    return fail(std::string(what) + " is not an integer");
  }
  bool i64(int64_t* out, const char* what) {
    if (type() == MP_INT) {
      *out = mp_decode_int(&p);
      return true;
    }
    if (type() == MP_UINT) {
      const uint64_t v = mp_decode_uint(&p);
      if (v > static_cast<uint64_t>(INT64_MAX)) return fail(std::string(what) + " is out of range");
      *out = static_cast<int64_t>(v);
      return true;
    }
    return fail(std::string(what) + " is not an integer");
  }
  bool f64(double* out, const char* what) {
    switch (type()) {
      case MP_DOUBLE: *out = mp_decode_double(&p); return true;
      case MP_FLOAT: *out = mp_decode_float(&p); return true;
      case MP_UINT: *out = static_cast<double>(mp_decode_uint(&p)); return true;
      case MP_INT: *out = static_cast<double>(mp_decode_int(&p)); return true;
      default: return fail(std::string(what) + " is not a number");
    }
  }
  bool str(std::string* out, const char* what) {
    if (type() != MP_STR) return fail(std::string(what) + " is not a string");
    uint32_t len = 0;
    const char* s = mp_decode_str(&p, &len);
    out->assign(s, len);
    return true;
  }
  bool is_nil() const { return type() == MP_NIL; }
  void skip() { mp_next(&p); }
  bool hashes(std::vector<uint64_t>* out) {
    uint32_t n = 0;
    if (!array(&n, "block_hashes")) return false;
    out->resize(n);
    for (uint32_t i = 0; i < n; ++i)
      if (!u64(&(*out)[i], "a block hash")) return false;
    return true;
  }
};

bool decode_event(Reader& r, KvEvent* ev) {
  uint32_t n = 0;
  if (!r.array(&n, "the event")) return false;
  if (n == 0) return r.fail("the event is an empty array");
  std::string tag;
  if (!r.str(&tag, "the event tag")) return false;
  uint32_t used = 1;
  if (tag == "BlockStored") {
    if (n < 5) return r.fail("BlockStored has " + std::to_string(n) + " fields, at least 5 are needed");
    ev->kind = KvEventKind::kStored;
    if (!r.hashes(&ev->block_hashes)) return false;
    if (r.is_nil()) {
      r.skip();
    } else {
      uint64_t parent = 0;
      if (!r.u64(&parent, "parent_block_hash")) return false;
      ev->parent_hash = parent;
    }
    uint32_t nt = 0;
    if (!r.array(&nt, "token_ids")) return false;
    ev->token_ids.resize(nt);
    for (uint32_t i = 0; i < nt; ++i) {
      int64_t t = 0;
      if (!r.i64(&t, "a token id")) return false;
      if (t < INT32_MIN || t > INT32_MAX) return r.fail("a token id is out of range");
      ev->token_ids[i] = static_cast<int32_t>(t);
    }
    if (!r.i64(&ev->block_size, "block_size")) return false;
    if (ev->block_size < 1) return r.fail("block_size must be at least 1");
    if (ev->token_ids.size() != static_cast<uint64_t>(ev->block_size) * ev->block_hashes.size())
      return r.fail("BlockStored has " + std::to_string(ev->token_ids.size()) + " token ids for " +
                    std::to_string(ev->block_hashes.size()) + " blocks of " + std::to_string(ev->block_size));
    used = 5;
    if (n > 5) {  // lora_id
      r.skip();
      ++used;
    }
    if (n > 6) {  // medium (nil: the default)
      if (r.is_nil()) r.skip();
      else if (!r.str(&ev->medium, "medium")) return false;
      ++used;
    }
    for (; used < n && used < 9; ++used) r.skip();  // lora_name, extra_keys
    if (n > 9) {
      if (r.is_nil()) r.skip();
      else if (!r.i64(&ev->group_idx, "group_idx")) return false;
      ++used;
    }
  } else if (tag == "BlockRemoved") {
    if (n < 2) return r.fail("BlockRemoved has no block_hashes");
    ev->kind = KvEventKind::kRemoved;
    if (!r.hashes(&ev->block_hashes)) return false;
    used = 2;
    if (n > 2) {
      if (r.is_nil()) r.skip();
      else if (!r.str(&ev->medium, "medium")) return false;
      ++used;
    }
    if (n > 3) {
      if (r.is_nil()) r.skip();
      else if (!r.i64(&ev->group_idx, "group_idx")) return false;
      ++used;
    }
  } else if (tag == "AllBlocksCleared") {
    ev->kind = KvEventKind::kCleared;
  } else {
    return r.fail("unknown event tag '" + tag + "'");
  }
  for (; used < n; ++used) r.skip();  // fields a later version may add
  return true;
}

}  // namespace

Expected<KvEventBatch> decode_kv_batch(const void* data, size_t size) {
  const char* begin = static_cast<const char*>(data);
  const char* end = begin + size;
  const char* check = begin;
  if (size == 0 || mp_check(&check, end) != 0) return make_error("the payload is not valid msgpack");
  if (check != end) return make_error("the payload has bytes after its msgpack value");
  Reader r{begin, {}};
  KvEventBatch batch;
  uint32_t n = 0;
  if (!r.array(&n, "the payload")) return make_error(r.err);
  if (n < 2) return make_error("the payload has " + std::to_string(n) + " fields, [ts, events, rank] expected");
  if (!r.f64(&batch.ts, "ts")) return make_error(r.err);
  uint32_t ne = 0;
  if (!r.array(&ne, "events")) return make_error(r.err);
  batch.events.resize(ne);
  for (uint32_t i = 0; i < ne; ++i)
    if (!decode_event(r, &batch.events[i])) return make_error("event " + std::to_string(i) + ": " + r.err);
  if (n > 2 && !r.is_nil() && !r.i64(&batch.dp_rank, "data_parallel_rank")) return make_error(r.err);
  return batch;
}

std::optional<uint64_t> decode_seq(const void* data, size_t size) {
  if (size != 8) return std::nullopt;
  const auto* b = static_cast<const unsigned char*>(data);
  uint64_t v = 0;
  for (int i = 0; i < 8; ++i) v = (v << 8) | b[i];
  return v;
}

void encode_seq(uint64_t seq, unsigned char out[8]) {
  for (int i = 7; i >= 0; --i, seq >>= 8) out[i] = static_cast<unsigned char>(seq & 0xff);
}

}  // namespace pagoda::router
