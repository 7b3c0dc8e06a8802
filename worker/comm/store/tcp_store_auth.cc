#include "worker/comm/store/tcp_store_auth.h"

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/rand.h>

#include <cstdio>
#include <cstdlib>

#include "worker/comm/store/tcp_store_protocol.h"

namespace cohort::comm {

std::string tcp_store_auth_nonce() {
  std::string nonce(kTcpStoreNonceBytes, '\0');
  if (RAND_bytes(reinterpret_cast<unsigned char*>(nonce.data()), static_cast<int>(nonce.size())) != 1) {
    std::fprintf(stderr, "cohort: RAND_bytes failed: the system's random source is unavailable\n");
    std::abort();
  }
  return nonce;
}

std::string tcp_store_auth_response(std::string_view secret, std::string_view nonce) {
  std::string message(kTcpStoreAuthContext);
  message.append(nonce);
  unsigned char digest[EVP_MAX_MD_SIZE];
  unsigned int size = 0;
  HMAC(EVP_sha256(), secret.data(), static_cast<int>(secret.size()),
       reinterpret_cast<const unsigned char*>(message.data()), message.size(), digest, &size);
  return std::string(reinterpret_cast<const char*>(digest), size);
}

bool tcp_store_auth_verify(std::string_view secret, std::string_view nonce, std::string_view response) {
  const std::string expected = tcp_store_auth_response(secret, nonce);
  return response.size() == expected.size() &&
         CRYPTO_memcmp(response.data(), expected.data(), expected.size()) == 0;
}

}  // namespace cohort::comm
