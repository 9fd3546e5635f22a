// libcurl for ResponsePolicyCurl (Debian: libcurl4-openssl-dev). curl_easy_setopt, curl_easy_getinfo,
// curl_multi_setopt and curl_share_setopt are variadic, which Swift cannot call: these typed
// wrappers call them with the one argument type each option takes.
#include <curl/curl.h>

typedef size_t (*ccurl_data_callback)(char *buffer, size_t size, size_t count, void *context);
typedef int (*ccurl_seek_callback)(void *context, curl_off_t offset, int origin);

static inline CURLcode ccurl_easy_setopt_long(CURL *handle, CURLoption option, long value) {
    return curl_easy_setopt(handle, option, value);
}

static inline CURLcode ccurl_easy_setopt_offset(CURL *handle, CURLoption option, curl_off_t value) {
    return curl_easy_setopt(handle, option, value);
}

static inline CURLcode ccurl_easy_setopt_pointer(CURL *handle, CURLoption option, const void *value) {
    return curl_easy_setopt(handle, option, value);
}

static inline CURLcode ccurl_easy_setopt_data_callback(CURL *handle, CURLoption option, ccurl_data_callback value) {
    return curl_easy_setopt(handle, option, value);
}

static inline CURLcode ccurl_easy_setopt_seek_callback(CURL *handle, CURLoption option, ccurl_seek_callback value) {
    return curl_easy_setopt(handle, option, value);
}

static inline CURLcode ccurl_easy_getinfo_long(CURL *handle, CURLINFO info, long *value) {
    return curl_easy_getinfo(handle, info, value);
}

static inline CURLcode ccurl_easy_getinfo_pointer(CURL *handle, CURLINFO info, void **value) {
    return curl_easy_getinfo(handle, info, value);
}

static inline CURLcode ccurl_easy_getinfo_offset(CURL *handle, CURLINFO info, curl_off_t *value) {
    return curl_easy_getinfo(handle, info, value);
}

static inline CURLMcode ccurl_multi_setopt_long(CURLM *multi, CURLMoption option, long value) {
    return curl_multi_setopt(multi, option, value);
}

static inline CURLSHcode ccurl_share_setopt_long(CURLSH *share, CURLSHoption option, long value) {
    return curl_share_setopt(share, option, value);
}

static inline long ccurl_global_all(void) { return CURL_GLOBAL_ALL; }
static inline int ccurl_seek_ok(void) { return CURL_SEEKFUNC_OK; }
static inline int ccurl_seek_fail(void) { return CURL_SEEKFUNC_FAIL; }
/// CURLMSG_DONE's result: a field of an anonymous union, out of Swift's reach.
static inline CURLcode ccurl_message_result(const CURLMsg *message) { return message->data.result; }
