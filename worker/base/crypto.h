#pragma once

// The few cryptographic primitives cohort's security model needs, over OpenSSL's libcrypto:
// random secrets, SHA-256 fingerprints of tokens and certificates, HMAC-SHA256, and a
// constant-time comparison. Nothing here invents cryptography; each function is one libcrypto call.
//
//   std::string token = random_hex(32);              // 256 bits from the OS's CSPRNG
//   std::string stored = sha256_hex(token);          // what the job database keeps
//   bool same = constant_time_equal(sha256_hex(presented), stored);
//
// Thread-safe.

#include <string>
#include <string_view>

#include "worker/base/status.h"

namespace cohort {

// `bytes` random bytes from RAND_bytes, as 2 * bytes lowercase hex digits. Aborts only if the
// system's random source fails (OpenSSL then cannot seed; nothing secure can go on).
std::string random_hex(size_t bytes);

// SHA-256 of `data`, lowercase hex (64 digits).
std::string sha256_hex(std::string_view data);

// HMAC-SHA256(key, message), lowercase hex (64 digits).
std::string hmac_sha256_hex(std::string_view key, std::string_view message);

// Whether a and b are equal, in time that depends only on their lengths (CRYPTO_memcmp).
bool constant_time_equal(std::string_view a, std::string_view b);

}  // namespace cohort
