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

// The multi handle's socket interface (curl_multi_socket_action): libcurl says which sockets to
// watch through a socket callback and when to call it back through a timer callback. Used by
// policy-bench's `async-libcurl-socket` floor (a request sent on the caller's thread).
typedef int (*ccurl_socket_callback)(CURL *easy, curl_socket_t socket, int what, void *context, void *socketContext);
typedef int (*ccurl_timer_callback)(CURLM *multi, long milliseconds, void *context);

static inline CURLMcode ccurl_multi_setopt_pointer(CURLM *multi, CURLMoption option, void *value) {
    return curl_multi_setopt(multi, option, value);
}

static inline CURLMcode ccurl_multi_setopt_socket_callback(CURLM *multi, ccurl_socket_callback value) {
    return curl_multi_setopt(multi, CURLMOPT_SOCKETFUNCTION, value);
}

static inline CURLMcode ccurl_multi_setopt_timer_callback(CURLM *multi, ccurl_timer_callback value) {
    return curl_multi_setopt(multi, CURLMOPT_TIMERFUNCTION, value);
}

#ifdef __linux__
#include <errno.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>

/// An eventfd that wakes a thread waiting in epoll: made non-blocking, signalled, drained.
static inline int ccurl_wake_make(void) { return eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK); }
static inline void ccurl_wake_signal(int fd) { eventfd_write(fd, 1); }
static inline void ccurl_wake_drain(int fd) { eventfd_t value; eventfd_read(fd, &value); }

/// Watches `fd` in the epoll set `poller` for what libcurl's socket callback asked
/// (CURL_POLL_IN, _OUT, _INOUT), or stops watching it (CURL_POLL_REMOVE). Level-triggered.
/// `watched` says whether the caller believes the set has it already (the other operation is
/// tried when the set disagrees).
static inline int ccurl_epoll_watch(int poller, int fd, int what, int watched) {
    if (what == CURL_POLL_REMOVE) {
        return epoll_ctl(poller, EPOLL_CTL_DEL, fd, NULL);
    }
    struct epoll_event event = {0};
    event.events = ((what & CURL_POLL_IN) ? EPOLLIN : 0) | ((what & CURL_POLL_OUT) ? EPOLLOUT : 0);
    event.data.fd = fd;
    if (epoll_ctl(poller, watched ? EPOLL_CTL_MOD : EPOLL_CTL_ADD, fd, &event) == 0) return 0;
    if (errno != ENOENT && errno != EEXIST) return -1;
    return epoll_ctl(poller, watched ? EPOLL_CTL_ADD : EPOLL_CTL_MOD, fd, &event);
}

/// Waits up to `timeout` ms for events on `poller`; fills `fds` and `masks` (CURL_CSELECT_IN,
/// _OUT, _ERR) and returns how many, or -1 (EINTR included).
static inline int ccurl_epoll_wait(int poller, int *fds, int *masks, int capacity, int timeout) {
    struct epoll_event events[64];
    if (capacity > 64) capacity = 64;
    int count = epoll_wait(poller, events, capacity, timeout);
    for (int index = 0; index < count; index++) {
        fds[index] = events[index].data.fd;
        unsigned got = events[index].events;
        masks[index] = ((got & EPOLLIN) ? CURL_CSELECT_IN : 0) | ((got & EPOLLOUT) ? CURL_CSELECT_OUT : 0)
            | ((got & (EPOLLERR | EPOLLHUP)) ? CURL_CSELECT_ERR : 0);
    }
    return count;
}
#endif
