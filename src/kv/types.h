// Plain integer ids shared by kv/ and everything built on it. kv/ never sees a
// pointer, tensor, request or model config: a sequence is a uint64 handle, a
// block is an index into KV storage, a token is a vocabulary id.
#pragma once
#include <cstdint>
#include <utility>

namespace pagoda::kv {

using BlockId = int32_t;
using TokenId = int32_t;
using SeqId = uint64_t;

// Block 0 is reserved (padding / placeholder for runners); it is never handed
// out, never freed and has no ref count.
inline constexpr BlockId kNullBlock = 0;

// A copy-on-write block copy the runner performs before the forward pass.
using BlockCopy = std::pair<BlockId, BlockId>;  // (src, dst)

// ceil(num_tokens / block_size) for non-negative num_tokens.
inline int32_t blocks_for_tokens(int64_t num_tokens, int32_t block_size) {
  return static_cast<int32_t>((num_tokens + block_size - 1) / block_size);
}

}  // namespace pagoda::kv
