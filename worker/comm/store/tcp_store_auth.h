#pragma once

// The tcp store's challenge-response (tcp_store_protocol.h): the server sends a random nonce, the
// client proves it holds the job's secret by answering HMAC-SHA256(secret, context || nonce). The
// secret never crosses the wire, and a recorded answer is useless against a fresh nonce. Nothing
// here is new cryptography: RAND_bytes, HMAC and CRYPTO_memcmp from OpenSSL's libcrypto.
//
// This authenticates clients only; it neither encrypts the store's traffic nor authenticates the
// server (store values are addresses and ids, not secrets).
//
// Thread-safe.

#include <string>
#include <string_view>

namespace cohort::comm {

// The environment variable that carries a job attempt's secret to its ranks (the agent sets it;
// any other launcher may set the same random string on every rank).
inline constexpr const char* kJobSecretEnvironmentVariable = "COHORT_JOB_SECRET";

// Bound into every answer, so an HMAC computed with the job secret for another purpose (the
// rendezvous store, say) is never a valid tcp store answer.
inline constexpr std::string_view kTcpStoreAuthContext = "cohort tcp store auth v1";

// kTcpStoreNonceBytes fresh random bytes (RAND_bytes). Aborts if the system's random source
// fails: nothing secure can go on then.
std::string tcp_store_auth_nonce();

// HMAC-SHA256(secret, kTcpStoreAuthContext || nonce): 32 raw bytes.
std::string tcp_store_auth_response(std::string_view secret, std::string_view nonce);

// Whether `response` is the right answer to `nonce`, compared in constant time (CRYPTO_memcmp).
bool tcp_store_auth_verify(std::string_view secret, std::string_view nonce, std::string_view response);

}  // namespace cohort::comm
