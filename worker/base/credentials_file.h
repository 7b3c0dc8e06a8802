#pragma once

// A cohort credentials file: YAML with three keys, so that schedulers and scripts in any language
// can read it.
//
//   coordinator: 10.0.0.1:7070
//   ca_certificate: |
//     -----BEGIN CERTIFICATE-----
//     ...
//   token: 3f9c...
//
// The coordinator writes the first admin's to <data_dir>/admin.credentials; `cohort user add`
// prints one per user. `cohort` finds it by --credentials FILE, else $COHORT_CREDENTIALS, else
// ~/.config/cohort/credentials.

#include <string>

#include "worker/base/status.h"

namespace cohort {

// The environment variable naming a credentials file.
inline constexpr const char* kCredentialsEnv = "COHORT_CREDENTIALS";
// Under $HOME.
inline constexpr const char* kDefaultCredentialsPath = ".config/cohort/credentials";
// Larger files are refused before parsing (a credentials file is about 1 KiB).
inline constexpr size_t kMaxCredentialsFileBytes = 64 * 1024;

struct Credentials {
  std::string coordinator;     // HOST:PORT
  std::string ca_certificate;  // PEM
  std::string token;           // the bearer token
};

// Parses the YAML text; `source` (a path) labels errors. INVALID_ARGUMENT naming the missing or
// unexpected key.
StatusOr<Credentials> parse_credentials(const std::string& text, const std::string& source);
// The YAML text of `credentials`.
std::string format_credentials(const Credentials& credentials);
// Reads and parses `path`. NOT_FOUND naming it (and how to get one) when it cannot be read.
StatusOr<Credentials> load_credentials(const std::string& path);
// The file to use: `flag` if non-empty, else $COHORT_CREDENTIALS, else ~/.config/cohort/credentials
// (empty when HOME is unset).
std::string credentials_path(const std::string& flag);

}  // namespace cohort
