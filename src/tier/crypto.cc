#include "tier/crypto.h"

#include <openssl/core_names.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/params.h>
#include <openssl/rand.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>

namespace pagoda::tier {

namespace {

[[noreturn]] void die(const char* what) {
  // A failure here is a broken libcrypto, not bad input: nothing sensible to serve with.
  std::fprintf(stderr, "pagoda: libcrypto: %s failed\n", what);
  std::abort();
}

EVP_MAC* hmac_algorithm() {
  static EVP_MAC* mac = EVP_MAC_fetch(nullptr, "HMAC", nullptr);
  if (mac == nullptr) die("EVP_MAC_fetch(HMAC)");
  return mac;
}

}  // namespace

HmacSha256::HmacSha256(std::string_view key) {
  EVP_MAC_CTX* c = EVP_MAC_CTX_new(hmac_algorithm());
  if (c == nullptr) die("EVP_MAC_CTX_new");
  char digest[] = "SHA256";
  const OSSL_PARAM params[] = {OSSL_PARAM_construct_utf8_string(OSSL_MAC_PARAM_DIGEST, digest, 0),
                               OSSL_PARAM_construct_end()};
  // An empty key is a valid HMAC key (zero-padded); OpenSSL wants a non-null pointer for it.
  static const unsigned char kEmpty[1] = {0};
  const auto* k = key.empty() ? kEmpty : reinterpret_cast<const unsigned char*>(key.data());
  if (EVP_MAC_init(c, k, key.size(), params) != 1) die("EVP_MAC_init");
  ctx_ = c;
}

HmacSha256::~HmacSha256() { EVP_MAC_CTX_free(static_cast<EVP_MAC_CTX*>(ctx_)); }

void HmacSha256::update(const void* data, size_t n) {
  if (n == 0) return;
  if (EVP_MAC_update(static_cast<EVP_MAC_CTX*>(ctx_), static_cast<const unsigned char*>(data), n) != 1)
    die("EVP_MAC_update");
}

Digest256 HmacSha256::final() {
  Digest256 d{};
  size_t len = 0;
  if (EVP_MAC_final(static_cast<EVP_MAC_CTX*>(ctx_), d.data(), &len, d.size()) != 1 || len != d.size())
    die("EVP_MAC_final");
  return d;
}

Digest256 hmac_sha256(std::string_view key, std::string_view data) {
  HmacSha256 h(key);
  h.update(data);
  return h.final();
}

void aes256_ctr(const uint8_t* key, const uint8_t* iv, const char* in, size_t n, char* out) {
  EVP_CIPHER_CTX* c = EVP_CIPHER_CTX_new();
  if (c == nullptr || EVP_EncryptInit_ex(c, EVP_aes_256_ctr(), nullptr, key, iv) != 1) die("EVP_EncryptInit_ex");
  size_t done = 0;
  while (done < n) {  // EVP takes an int length
    const int chunk = static_cast<int>(std::min<size_t>(n - done, size_t{1} << 30));
    int outl = 0;
    if (EVP_EncryptUpdate(c, reinterpret_cast<unsigned char*>(out + done), &outl,
                          reinterpret_cast<const unsigned char*>(in + done), chunk) != 1 ||
        outl != chunk)
      die("EVP_EncryptUpdate");
    done += static_cast<size_t>(chunk);
  }
  EVP_CIPHER_CTX_free(c);
}

void random_bytes(uint8_t* out, size_t n) {
  if (RAND_bytes(out, static_cast<int>(n)) != 1) die("RAND_bytes");
}

bool equal_constant_time(const void* a, const void* b, size_t n) { return CRYPTO_memcmp(a, b, n) == 0; }

}  // namespace pagoda::tier
