#ifndef TANDEM_COMMON_TESTING_HTTP_GET_H_
#define TANDEM_COMMON_TESTING_HTTP_GET_H_

#include <curl/curl.h>

#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"

namespace tandem::testing {

// Fetches a URL over real HTTP, as a Prometheus scrape would.
inline absl::StatusOr<std::string> HttpGet(const std::string& url) {
  std::string body;
  CURL* curl = curl_easy_init();
  curl_easy_setopt(curl, CURLOPT_URL, url.c_str());
  curl_easy_setopt(
      curl, CURLOPT_WRITEFUNCTION, +[](char* data, size_t size, size_t count, void* sink) {
        static_cast<std::string*>(sink)->append(data, size * count);
        return size * count;
      });
  curl_easy_setopt(curl, CURLOPT_WRITEDATA, &body);
  curl_easy_setopt(curl, CURLOPT_TIMEOUT, 10L);
  const CURLcode code = curl_easy_perform(curl);
  curl_easy_cleanup(curl);
  if (code != CURLE_OK) {
    return absl::UnavailableError(absl::StrCat("GET ", url, ": ", curl_easy_strerror(code)));
  }
  return body;
}

}  // namespace tandem::testing

#endif  // TANDEM_COMMON_TESTING_HTTP_GET_H_
