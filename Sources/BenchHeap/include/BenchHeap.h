#ifndef BENCH_HEAP_H
#define BENCH_HEAP_H

#include <stddef.h>

/// Bytes the process has allocated with malloc and not freed, in every arena and in mmap'ed
/// blocks (glibc's mallinfo2); 0 where there is no mallinfo2. For policy-bench's retained-memory
/// figures: a per-request leak shows as growth over thousands of requests.
size_t bench_heap_in_use(void);

#endif
