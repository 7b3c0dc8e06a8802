#include "daemon/security/cluster_ca.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <openssl/bio.h>
#include <openssl/bn.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/x509.h>
#include <openssl/x509v3.h>

#include <cerrno>
#include <cstring>
#include <ctime>
#include <fstream>
#include <sstream>
#include <utility>

#include <fmt/format.h>

#include "worker/base/crypto.h"

namespace cohort::security {
namespace {

struct BioFree {
  void operator()(BIO* b) const { BIO_free(b); }
};
struct PkeyFree {
  void operator()(EVP_PKEY* k) const { EVP_PKEY_free(k); }
};
struct X509Free {
  void operator()(X509* x) const { X509_free(x); }
};
struct ReqFree {
  void operator()(X509_REQ* r) const { X509_REQ_free(r); }
};
using BioPtr = std::unique_ptr<BIO, BioFree>;
using PkeyPtr = std::unique_ptr<EVP_PKEY, PkeyFree>;
using X509Ptr = std::unique_ptr<X509, X509Free>;
using ReqPtr = std::unique_ptr<X509_REQ, ReqFree>;

// The newest OpenSSL error as text, for messages ("error:...:PEM routines::no start line").
std::string openssl_error() {
  const unsigned long code = ERR_get_error();
  ERR_clear_error();
  if (code == 0) return "no OpenSSL error recorded";
  char buffer[256];
  ERR_error_string_n(code, buffer, sizeof(buffer));
  return buffer;
}

#define COHORT_OPENSSL_CHECK(call)                                                                    \
  do {                                                                                                \
    if (!(call)) return internal_error("{} failed at {}:{}: {}", #call, __FILE__, __LINE__, openssl_error()); \
  } while (0)

StatusOr<std::string> bio_text(BIO* bio) {
  char* data = nullptr;
  const long size = BIO_get_mem_data(bio, &data);
  if (size < 0) return internal_error("BIO_get_mem_data failed: {}", openssl_error());
  return std::string(data, static_cast<size_t>(size));
}

StatusOr<PkeyPtr> new_ec_key() {
  PkeyPtr key(EVP_EC_gen("P-256"));
  if (!key) return internal_error("EVP_EC_gen(P-256) failed: {}", openssl_error());
  return key;
}

StatusOr<std::string> key_pem(EVP_PKEY* key) {
  BioPtr bio(BIO_new(BIO_s_mem()));
  COHORT_OPENSSL_CHECK(PEM_write_bio_PrivateKey(bio.get(), key, nullptr, nullptr, 0, nullptr, nullptr));
  return bio_text(bio.get());
}

StatusOr<std::string> cert_pem(X509* cert) {
  BioPtr bio(BIO_new(BIO_s_mem()));
  COHORT_OPENSSL_CHECK(PEM_write_bio_X509(bio.get(), cert));
  return bio_text(bio.get());
}

StatusOr<X509Ptr> parse_cert(const std::string& pem) {
  BioPtr bio(BIO_new_mem_buf(pem.data(), static_cast<int>(pem.size())));
  X509Ptr cert(PEM_read_bio_X509(bio.get(), nullptr, nullptr, nullptr));
  if (!cert) return invalid_argument_error("not a PEM certificate: {}", openssl_error());
  return cert;
}

StatusOr<PkeyPtr> parse_key(const std::string& pem) {
  BioPtr bio(BIO_new_mem_buf(pem.data(), static_cast<int>(pem.size())));
  PkeyPtr key(PEM_read_bio_PrivateKey(bio.get(), nullptr, nullptr, nullptr));
  if (!key) return invalid_argument_error("not a PEM private key: {}", openssl_error());
  return key;
}

std::string der_fingerprint(X509* cert) {
  unsigned char* der = nullptr;
  const int size = i2d_X509(cert, &der);
  if (size <= 0) return "";
  std::string fingerprint = sha256_hex(std::string_view(reinterpret_cast<char*>(der), static_cast<size_t>(size)));
  OPENSSL_free(der);
  return fingerprint;
}

Status add_extension(X509* cert, X509* issuer, int nid, const std::string& value) {
  X509V3_CTX ctx;
  X509V3_set_ctx_nodb(&ctx);
  X509V3_set_ctx(&ctx, issuer, cert, nullptr, nullptr, 0);
  X509_EXTENSION* extension = X509V3_EXT_conf_nid(nullptr, &ctx, nid, value.c_str());
  if (extension == nullptr)
    return internal_error("certificate extension {} = {:?}: {}", OBJ_nid2sn(nid), value, openssl_error());
  const int added = X509_add_ext(cert, extension, -1);
  X509_EXTENSION_free(extension);
  if (added != 1) return internal_error("X509_add_ext({}): {}", OBJ_nid2sn(nid), openssl_error());
  return ok_status();
}

Status add_alt_names(X509* cert, X509* issuer, const std::vector<std::string>& dns_names,
                     const std::vector<std::string>& ip_addresses) {
  std::string value;
  for (const std::string& dns : dns_names) value += (value.empty() ? "" : ",") + ("DNS:" + dns);
  for (const std::string& ip : ip_addresses) value += (value.empty() ? "" : ",") + ("IP:" + ip);
  if (value.empty()) return ok_status();
  return add_extension(cert, issuer, NID_subject_alt_name, value);
}

// A certificate for `public_key` with a random 128-bit serial, CN = `common_name` and the given
// alternative names, valid from an hour ago (clock skew between nodes) for `validity` from now,
// signed by `signer_key` as `issuer` (null: self-signed, a CA).
StatusOr<X509Ptr> make_certificate(EVP_PKEY* public_key, const std::string& common_name, X509* issuer,
                                   EVP_PKEY* signer_key, std::chrono::seconds validity,
                                   const std::vector<std::string>& dns_names = {},
                                   const std::vector<std::string>& ip_addresses = {}) {
  X509Ptr cert(X509_new());
  COHORT_OPENSSL_CHECK(X509_set_version(cert.get(), 2));
  const std::string serial_hex = random_hex(16);
  BIGNUM* serial = nullptr;
  COHORT_OPENSSL_CHECK(BN_hex2bn(&serial, serial_hex.c_str()));
  ASN1_INTEGER* asn1_serial = BN_to_ASN1_INTEGER(serial, X509_get_serialNumber(cert.get()));
  BN_free(serial);
  COHORT_OPENSSL_CHECK(asn1_serial != nullptr);
  COHORT_OPENSSL_CHECK(X509_gmtime_adj(X509_getm_notBefore(cert.get()), -3600));
  COHORT_OPENSSL_CHECK(X509_gmtime_adj(X509_getm_notAfter(cert.get()), static_cast<long>(validity.count())));
  COHORT_OPENSSL_CHECK(X509_set_pubkey(cert.get(), public_key));
  X509_NAME* name = X509_get_subject_name(cert.get());
  COHORT_OPENSSL_CHECK(X509_NAME_add_entry_by_txt(name, "O", MBSTRING_ASC,
                                                  reinterpret_cast<const unsigned char*>("cohort"), -1, -1, 0));
  COHORT_OPENSSL_CHECK(X509_NAME_add_entry_by_txt(
      name, "CN", MBSTRING_ASC, reinterpret_cast<const unsigned char*>(common_name.c_str()), -1, -1, 0));
  COHORT_OPENSSL_CHECK(X509_set_issuer_name(cert.get(), issuer != nullptr ? X509_get_subject_name(issuer) : name));
  X509* issuer_or_self = issuer != nullptr ? issuer : cert.get();
  if (issuer == nullptr) {
    COHORT_RETURN_IF_ERROR(add_extension(cert.get(), issuer_or_self, NID_basic_constraints, "critical,CA:TRUE"));
    COHORT_RETURN_IF_ERROR(add_extension(cert.get(), issuer_or_self, NID_key_usage, "critical,keyCertSign,cRLSign"));
    COHORT_RETURN_IF_ERROR(add_extension(cert.get(), issuer_or_self, NID_subject_key_identifier, "hash"));
  } else {
    COHORT_RETURN_IF_ERROR(add_extension(cert.get(), issuer_or_self, NID_basic_constraints, "critical,CA:FALSE"));
    COHORT_RETURN_IF_ERROR(
        add_extension(cert.get(), issuer_or_self, NID_key_usage, "critical,digitalSignature,keyEncipherment"));
    COHORT_RETURN_IF_ERROR(add_extension(cert.get(), issuer_or_self, NID_ext_key_usage, "serverAuth,clientAuth"));
    COHORT_RETURN_IF_ERROR(add_extension(cert.get(), issuer_or_self, NID_authority_key_identifier, "keyid:always"));
    COHORT_RETURN_IF_ERROR(add_alt_names(cert.get(), issuer_or_self, dns_names, ip_addresses));
  }
  if (X509_sign(cert.get(), signer_key, EVP_sha256()) == 0)
    return internal_error("X509_sign failed: {}", openssl_error());
  return cert;
}

}  // namespace

struct ClusterCa::Keys {
  PkeyPtr key;
  X509Ptr certificate;
};

ClusterCa::ClusterCa(std::unique_ptr<Keys> keys) : keys_(std::move(keys)) {}
ClusterCa::ClusterCa(ClusterCa&&) noexcept = default;
ClusterCa& ClusterCa::operator=(ClusterCa&&) noexcept = default;
ClusterCa::~ClusterCa() = default;

StatusOr<std::string> read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return not_found_error("cannot read {}: {}", path, std::strerror(errno));
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

Status write_private_file(const std::string& path, const std::string& contents, int mode) {
  const std::string temp = fmt::format("{}.tmp-{}", path, random_hex(8));
  const int fd = ::open(temp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, mode);
  if (fd < 0) return internal_error("cannot create {}: {}", temp, std::strerror(errno));
  size_t written = 0;
  while (written < contents.size()) {
    const ssize_t n = ::write(fd, contents.data() + written, contents.size() - written);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      const int error = errno;
      ::close(fd);
      ::unlink(temp.c_str());
      return internal_error("cannot write {}: {}", temp, std::strerror(error));
    }
    written += static_cast<size_t>(n);
  }
  ::fchmod(fd, static_cast<mode_t>(mode));  // the umask may have narrowed it; never widened beyond `mode`
  if (::fsync(fd) != 0 || ::close(fd) != 0) {
    ::unlink(temp.c_str());
    return internal_error("cannot write {}: {}", temp, std::strerror(errno));
  }
  // rename() replaces a symlink at `path` itself rather than writing through it.
  if (::rename(temp.c_str(), path.c_str()) != 0) {
    const int error = errno;
    ::unlink(temp.c_str());
    return internal_error("cannot rename {} to {}: {}", temp, path, std::strerror(error));
  }
  return ok_status();
}

StatusOr<ClusterCa> ClusterCa::load_or_create(const std::string& dir) {
  if (::mkdir(dir.c_str(), 0700) != 0 && errno != EEXIST)
    return internal_error("cannot create the CA directory {}: {}", dir, std::strerror(errno));
  struct stat info {};
  if (::lstat(dir.c_str(), &info) != 0 || !S_ISDIR(info.st_mode))
    return failed_precondition_error("{} is not a directory; the cluster CA lives there", dir);
  if ((info.st_mode & 077) != 0) ::chmod(dir.c_str(), 0700);
  const std::string key_path = dir + "/ca.key";
  const std::string cert_path = dir + "/ca.crt";
  const bool has_key = ::access(key_path.c_str(), F_OK) == 0;
  const bool has_cert = ::access(cert_path.c_str(), F_OK) == 0;
  auto keys = std::make_unique<Keys>();
  if (has_key != has_cert) {
    return failed_precondition_error(
        "{} exists but {} does not; restore the missing file from a backup, or move both away to create "
        "a new cluster CA (every node must then join again)",
        has_key ? key_path : cert_path, has_key ? cert_path : key_path);
  }
  if (has_key) {
    COHORT_ASSIGN_OR_RETURN(std::string key_text, read_file(key_path));
    COHORT_ASSIGN_OR_RETURN(std::string cert_text, read_file(cert_path));
    StatusOr<PkeyPtr> key = parse_key(key_text);
    if (!key.ok()) return key.status().with_context(key_path);
    StatusOr<X509Ptr> cert = parse_cert(cert_text);
    if (!cert.ok()) return cert.status().with_context(cert_path);
    keys->key = std::move(*key);
    keys->certificate = std::move(*cert);
    if (X509_check_private_key(keys->certificate.get(), keys->key.get()) != 1) {
      return failed_precondition_error("{} is not the key of {}; restore the matching pair from a backup", key_path,
                                       cert_path);
    }
  } else {
    COHORT_ASSIGN_OR_RETURN(keys->key, new_ec_key());
    COHORT_ASSIGN_OR_RETURN(keys->certificate,
                            make_certificate(keys->key.get(), "cohort cluster CA", nullptr, keys->key.get(), kCaValidity));
    COHORT_ASSIGN_OR_RETURN(std::string key_text, key_pem(keys->key.get()));
    COHORT_ASSIGN_OR_RETURN(std::string cert_text, cert_pem(keys->certificate.get()));
    COHORT_RETURN_IF_ERROR(write_private_file(key_path, key_text, 0600));
    COHORT_RETURN_IF_ERROR(write_private_file(cert_path, cert_text, 0644));
  }
  ClusterCa ca(std::move(keys));
  COHORT_ASSIGN_OR_RETURN(ca.certificate_pem_, cert_pem(ca.keys_->certificate.get()));
  ca.fingerprint_ = der_fingerprint(ca.keys_->certificate.get());
  return ca;
}

StatusOr<IssuedCertificate> ClusterCa::sign_leaf(EVP_PKEY* public_key, const std::string& common_name,
                                                 const std::vector<std::string>& dns_names,
                                                 const std::vector<std::string>& ip_addresses,
                                                 std::chrono::seconds validity) const {
  COHORT_ASSIGN_OR_RETURN(X509Ptr cert, make_certificate(public_key, common_name, keys_->certificate.get(),
                                                         keys_->key.get(), validity, dns_names, ip_addresses));
  IssuedCertificate out;
  COHORT_ASSIGN_OR_RETURN(out.certificate_pem, cert_pem(cert.get()));
  COHORT_ASSIGN_OR_RETURN(CertificateInfo info, certificate_info(out.certificate_pem));
  out.serial = info.serial;
  return out;
}

StatusOr<KeyAndCertificate> ClusterCa::issue(const std::string& common_name, const std::vector<std::string>& dns_names,
                                             const std::vector<std::string>& ip_addresses,
                                             std::chrono::seconds validity) const {
  COHORT_ASSIGN_OR_RETURN(PkeyPtr key, new_ec_key());
  COHORT_ASSIGN_OR_RETURN(IssuedCertificate issued,
                          sign_leaf(key.get(), common_name, dns_names, ip_addresses, validity));
  KeyAndCertificate out;
  COHORT_ASSIGN_OR_RETURN(out.key_pem, key_pem(key.get()));
  out.certificate_pem = std::move(issued.certificate_pem);
  out.serial = std::move(issued.serial);
  return out;
}

StatusOr<IssuedCertificate> ClusterCa::sign_csr(const std::string& csr_pem, const std::string& common_name,
                                                const std::vector<std::string>& dns_names,
                                                const std::vector<std::string>& ip_addresses,
                                                std::chrono::seconds validity) const {
  BioPtr bio(BIO_new_mem_buf(csr_pem.data(), static_cast<int>(csr_pem.size())));
  ReqPtr request(PEM_read_bio_X509_REQ(bio.get(), nullptr, nullptr, nullptr));
  if (!request) return invalid_argument_error("csr_pem is not a PEM certificate request: {}", openssl_error());
  PkeyPtr public_key(X509_REQ_get_pubkey(request.get()));
  if (!public_key || X509_REQ_verify(request.get(), public_key.get()) != 1)
    return invalid_argument_error("csr_pem's signature does not verify: {}", openssl_error());
  return sign_leaf(public_key.get(), common_name, dns_names, ip_addresses, validity);
}

StatusOr<KeyAndCsr> make_key_and_csr(const std::string& common_name) {
  COHORT_ASSIGN_OR_RETURN(PkeyPtr key, new_ec_key());
  ReqPtr request(X509_REQ_new());
  COHORT_OPENSSL_CHECK(X509_REQ_set_version(request.get(), 0));
  X509_NAME* name = X509_REQ_get_subject_name(request.get());
  COHORT_OPENSSL_CHECK(X509_NAME_add_entry_by_txt(
      name, "CN", MBSTRING_ASC, reinterpret_cast<const unsigned char*>(common_name.c_str()), -1, -1, 0));
  COHORT_OPENSSL_CHECK(X509_REQ_set_pubkey(request.get(), key.get()));
  COHORT_OPENSSL_CHECK(X509_REQ_sign(request.get(), key.get(), EVP_sha256()));
  BioPtr bio(BIO_new(BIO_s_mem()));
  COHORT_OPENSSL_CHECK(PEM_write_bio_X509_REQ(bio.get(), request.get()));
  KeyAndCsr out;
  COHORT_ASSIGN_OR_RETURN(out.csr_pem, bio_text(bio.get()));
  COHORT_ASSIGN_OR_RETURN(out.key_pem, key_pem(key.get()));
  return out;
}

StatusOr<std::string> certificate_fingerprint(const std::string& certificate_pem) {
  COHORT_ASSIGN_OR_RETURN(X509Ptr cert, parse_cert(certificate_pem));
  return der_fingerprint(cert.get());
}

StatusOr<CertificateInfo> certificate_info(const std::string& certificate_pem) {
  COHORT_ASSIGN_OR_RETURN(X509Ptr cert, parse_cert(certificate_pem));
  CertificateInfo info;
  BIGNUM* serial = ASN1_INTEGER_to_BN(X509_get_serialNumber(cert.get()), nullptr);
  if (serial != nullptr) {
    char* hex = BN_bn2hex(serial);
    info.serial = hex;
    OPENSSL_free(hex);
    BN_free(serial);
  }
  char common_name[256] = {};
  if (X509_NAME_get_text_by_NID(X509_get_subject_name(cert.get()), NID_commonName, common_name,
                                sizeof(common_name)) > 0) {
    info.common_name = common_name;
  }
  std::tm when{};
  if (ASN1_TIME_to_tm(X509_get0_notBefore(cert.get()), &when) != 1)
    return invalid_argument_error("the certificate's notBefore does not parse: {}", openssl_error());
  info.not_before_unix = static_cast<int64_t>(timegm(&when));
  if (ASN1_TIME_to_tm(X509_get0_notAfter(cert.get()), &when) != 1)
    return invalid_argument_error("the certificate's notAfter does not parse: {}", openssl_error());
  info.not_after_unix = static_cast<int64_t>(timegm(&when));
  return info;
}

bool certificate_matches_key(const std::string& certificate_pem, const std::string& key_pem) {
  StatusOr<X509Ptr> cert = parse_cert(certificate_pem);
  StatusOr<PkeyPtr> key = parse_key(key_pem);
  const bool matches = cert.ok() && key.ok() && X509_check_private_key(cert->get(), key->get()) == 1;
  ERR_clear_error();
  return matches;
}

std::string format_utc(int64_t unix_seconds) {
  const std::time_t seconds = static_cast<std::time_t>(unix_seconds);
  std::tm when{};
  gmtime_r(&seconds, &when);
  char text[64] = {};
  std::strftime(text, sizeof(text), "%Y-%m-%d %H:%M:%S UTC", &when);
  return text;
}

}  // namespace cohort::security
