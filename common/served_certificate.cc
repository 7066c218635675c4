#include "common/served_certificate.h"

#include <openssl/bio.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/x509.h>

#include <ctime>
#include <memory>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/status.h"

namespace tandem {
namespace {

struct BioFree {
  void operator()(BIO* bio) const { BIO_free(bio); }
};
struct X509Free {
  void operator()(X509* certificate) const { X509_free(certificate); }
};
struct KeyFree {
  void operator()(EVP_PKEY* key) const { EVP_PKEY_free(key); }
};

std::unique_ptr<BIO, BioFree> MemoryBio(absl::string_view pem) {
  return std::unique_ptr<BIO, BioFree>(BIO_new_mem_buf(pem.data(), static_cast<int>(pem.size())));
}

// The first certificate of a PEM bundle; null when there is none.
std::unique_ptr<X509, X509Free> FirstCertificate(absl::string_view pem) {
  return std::unique_ptr<X509, X509Free>(
      PEM_read_bio_X509(MemoryBio(pem).get(), nullptr, nullptr, nullptr));
}

absl::StatusOr<absl::Time> NotAfter(const X509& certificate) {
  std::tm expiry{};
  if (ASN1_TIME_to_tm(X509_get0_notAfter(&certificate), &expiry) != 1) {
    return InvalidRequest("BAD_CERTIFICATE", "the certificate's notAfter time does not parse");
  }
  return absl::FromTimeT(timegm(&expiry));
}

absl::StatusOr<absl::Time> CheckParsed(absl::string_view chain_pem, absl::string_view key_pem,
                                       absl::string_view client_ca_pem, absl::Time now) {
  const std::unique_ptr<X509, X509Free> certificate = FirstCertificate(chain_pem);
  if (certificate == nullptr) {
    return InvalidRequest("BAD_CERTIFICATE", "the certificate chain holds no PEM certificate");
  }
  const std::unique_ptr<EVP_PKEY, KeyFree> key(
      PEM_read_bio_PrivateKey(MemoryBio(key_pem).get(), nullptr, nullptr, nullptr));
  if (key == nullptr) return InvalidRequest("BAD_CERTIFICATE", "the private key is not a PEM key");
  if (X509_check_private_key(certificate.get(), key.get()) != 1) {
    return InvalidRequest("BAD_CERTIFICATE", "the private key does not belong to the certificate");
  }
  if (!client_ca_pem.empty() && FirstCertificate(client_ca_pem) == nullptr) {
    return InvalidRequest("BAD_CERTIFICATE", "the client CA bundle holds no PEM certificate");
  }
  absl::StatusOr<absl::Time> expiry = NotAfter(*certificate);
  if (expiry.ok() && *expiry <= now) {
    return InvalidRequest("BAD_CERTIFICATE",
                          absl::StrCat("the certificate expired at ", absl::FormatTime(*expiry)));
  }
  return expiry;
}

}  // namespace

absl::StatusOr<absl::Time> CheckServedCertificate(absl::string_view chain_pem,
                                                  absl::string_view key_pem,
                                                  absl::string_view client_ca_pem, absl::Time now) {
  absl::StatusOr<absl::Time> expiry = CheckParsed(chain_pem, key_pem, client_ca_pem, now);
  // OpenSSL's per-thread error queue is gRPC's too: a parse error left there would be read as
  // the cause of this thread's next TLS failure.
  ERR_clear_error();
  return expiry;
}

}  // namespace tandem
