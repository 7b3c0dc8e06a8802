#pragma once

// ClusterCa: the cluster's certificate authority, kept in the coordinator's data directory, as k3s
// and kubeadm bootstrap theirs. On first start it creates an EC P-256 key and a self-signed CA
// certificate; later starts load them. It signs the coordinator's own certificate and, through
// JoinCluster, each node's.
//
//   COHORT_ASSIGN_OR_RETURN(ClusterCa ca, ClusterCa::load_or_create(data_dir + "/ca"));
//   COHORT_ASSIGN_OR_RETURN(KeyAndCsr node, make_key_and_csr("node-a"));      // on the node
//   COHORT_ASSIGN_OR_RETURN(IssuedCertificate cert, ca.sign_csr(node.csr_pem, "node-a", {"node-a"}, {}));
//
// Files (directory mode 0700): ca.key (0600), ca.crt. Not thread-safe for load_or_create; the
// signing methods are const and may run concurrently.

#include <openssl/types.h>

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "worker/base/status.h"

namespace cohort::security {

// How long the CA certificate is valid (it is created once per cluster).
inline constexpr std::chrono::hours kCaValidity{24 * 365 * 10};
// How long a node's or the coordinator's certificate is valid; the coordinator's is re-issued at
// every start, a node's when it joins again or renews it (RenewNodeCertificate).
inline constexpr std::chrono::hours kLeafValidity{24 * 365};
// A node renews its certificate once less than this fraction of its validity is left: the last
// third, about 122 days of a kLeafValidity certificate, which leaves an agent that cannot reach its
// coordinator for weeks, or is rarely restarted, months to renew before the certificate expires.
inline constexpr int kRenewalWindowDivisor = 3;

// A private key and a certificate signing request, both PEM.
struct KeyAndCsr {
  std::string key_pem;
  std::string csr_pem;
};

// A certificate the CA signed.
struct IssuedCertificate {
  std::string certificate_pem;
  std::string serial;  // hex, unique per certificate (the revocation key)
};

// A private key and the certificate for it, both PEM.
struct KeyAndCertificate {
  std::string key_pem;
  std::string certificate_pem;
  std::string serial;
};

class ClusterCa {
 public:
  ClusterCa(ClusterCa&&) noexcept;
  ClusterCa& operator=(ClusterCa&&) noexcept;
  ~ClusterCa();

  // Loads <dir>/ca.key and <dir>/ca.crt, or creates both (and `dir`, mode 0700) when neither
  // exists. One without the other is FAILED_PRECONDITION naming the files (never overwritten).
  static StatusOr<ClusterCa> load_or_create(const std::string& dir);

  // The CA certificate, PEM: what clients trust.
  const std::string& certificate_pem() const { return certificate_pem_; }
  // SHA-256 of the CA certificate's DER encoding, lowercase hex: what a join token pins.
  const std::string& fingerprint() const { return fingerprint_; }

  // A new key and a certificate for it with subject CN = `common_name` and the given DNS and IP
  // subject alternative names, for both TLS server and client use, valid for `validity` (tests
  // shorten it).
  StatusOr<KeyAndCertificate> issue(const std::string& common_name, const std::vector<std::string>& dns_names,
                                    const std::vector<std::string>& ip_addresses,
                                    std::chrono::seconds validity = kLeafValidity) const;
  // Signs the public key of `csr_pem` (its signature checked; its subject ignored) as above.
  StatusOr<IssuedCertificate> sign_csr(const std::string& csr_pem, const std::string& common_name,
                                       const std::vector<std::string>& dns_names,
                                       const std::vector<std::string>& ip_addresses,
                                       std::chrono::seconds validity = kLeafValidity) const;

 private:
  struct Keys;
  explicit ClusterCa(std::unique_ptr<Keys> keys);
  // The one signing step of issue() and sign_csr(): a leaf certificate for `public_key`.
  StatusOr<IssuedCertificate> sign_leaf(EVP_PKEY* public_key, const std::string& common_name,
                                        const std::vector<std::string>& dns_names,
                                        const std::vector<std::string>& ip_addresses,
                                        std::chrono::seconds validity) const;
  std::unique_ptr<Keys> keys_;
  std::string certificate_pem_;
  std::string fingerprint_;
};

// A new EC P-256 key and a CSR for it with CN = `common_name` (a node making its join request).
StatusOr<KeyAndCsr> make_key_and_csr(const std::string& common_name);

// SHA-256 of a PEM certificate's DER encoding, lowercase hex. INVALID_ARGUMENT if it does not parse.
StatusOr<std::string> certificate_fingerprint(const std::string& certificate_pem);

// The serial number (hex), subject CN and validity period of a PEM certificate.
struct CertificateInfo {
  std::string serial;
  std::string common_name;
  int64_t not_before_unix = 0;  // seconds since the epoch
  int64_t not_after_unix = 0;
  // When a node renews this certificate: kRenewalWindowDivisor-th of its validity before notAfter.
  int64_t renew_after_unix() const { return not_after_unix - (not_after_unix - not_before_unix) / kRenewalWindowDivisor; }
};
StatusOr<CertificateInfo> certificate_info(const std::string& certificate_pem);
// Whether `certificate_pem` certifies the public key of the private key `key_pem`.
bool certificate_matches_key(const std::string& certificate_pem, const std::string& key_pem);
// "2027-11-24 07:52:43 UTC": a certificate's dates in messages.
std::string format_utc(int64_t unix_seconds);

// Writes `contents` to `path` with `mode`, created exclusively under a temporary unique name and
// renamed into place, so a reader never sees a half-written key. Never follows a symlink at `path`.
Status write_private_file(const std::string& path, const std::string& contents, int mode);
// Reads a whole file. NOT_FOUND naming the path.
StatusOr<std::string> read_file(const std::string& path);

}  // namespace cohort::security
