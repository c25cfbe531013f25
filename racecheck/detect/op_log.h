// racecheck/detect/op_log.h: the layout of the native operator log's records and items, which the
// log writes (op_log.cpp), Python reads from the bytes of a drained batch (feed_apply.py's RECORD and
// ITEM struct formats) and the native engine applies (hb_tracker.cpp).
//
// The layouts are fixed, native byte order, their padding spelled out as fields, and the
// static_asserts below pin them. Change one side, change the others.

#pragma once

#include <cstddef>
#include <cstdint>

namespace racecheck_log {

// Access codes of an item.
enum Access : int8_t { READ = 0, WRITE = 1, RESOLVE = 2 };  // RESOLVE: a return that sizes a fresh block
// Record types.
enum Type : int8_t {
  OP = 0,
  COLLECTIVE_BEGIN = 1,
  COLLECTIVE_END = 2,
  STREAM_RECORDED = 3,
  HOST_FREED = 4,
  // CUDA's trace events; `extra` is the address or event, `stream` a cudaStream_t (ALLOCATED:
  // the c10 id of the stream current at the allocation)
  ALLOCATED = 5,
  FREED = 6,
  EVENT_RECORDED = 7,
  EVENT_WAITED = 8,
  EVENT_DELETED = 9,
  DEVICE_SYNCED = 10,
  STREAM_SYNCED = 11,
  EVENT_SYNCED = 12,
  // A kernel launched below the dispatcher (a Triton kernel, kernel_launches.py), reported from
  // Python as it launches: its items are the tensors it reads and writes; `extra` is the
  // cudaStream_t it runs on.
  KERNEL = 13,
};
constexpr int TYPES = 14;
// The overload name of a kernel's pseudo-operator in the table (its name is the kernel's).
constexpr const char* KERNEL_OVERLOAD = "<kernel>";

constexpr int64_t NO_STREAM = INT64_MIN;  // no CUDA tensor, or the CPU tracker: Python's current stream
constexpr int8_t CUDA_DEVICE = 1;         // an item's device: 0 CPU, 1 CUDA, 2 other

struct Item {
  uint64_t ptr, nbytes, sptr, snbytes;
  int8_t access, device;  // device: 0 CPU, 1 CUDA, 2 other
  int8_t pinned;          // host memory only: page-locked
  int8_t pad[5];          // (to the 8-byte alignment of the array's next item)
};
static_assert(sizeof(Item) == 40, "feed_apply.ITEM is '=QQQQbbb5x'");
static_assert(offsetof(Item, nbytes) == 8 && offsetof(Item, sptr) == 16 && offsetof(Item, snbytes) == 24 &&
                  offsetof(Item, access) == 32 && offsetof(Item, device) == 33 && offsetof(Item, pinned) == 34,
              "feed_apply.ITEM is '=QQQQbbb5x'");

struct Record {
  int8_t type;
  int8_t pad0[3];
  int32_t op;
  int64_t stream;
  int32_t device_index;
  int32_t pad1;
  int64_t frame;
  uint32_t first, count;  // its items
  int64_t extra;          // OP: non_blocking; STREAM_RECORDED: the stream id; HOST_FREED: the storage
};
static_assert(sizeof(Record) == 48, "feed_apply.RECORD is '=b3xiqi4xqIIq'");
static_assert(offsetof(Record, op) == 4 && offsetof(Record, stream) == 8 && offsetof(Record, device_index) == 16 &&
                  offsetof(Record, frame) == 24 && offsetof(Record, first) == 32 && offsetof(Record, count) == 36 &&
                  offsetof(Record, extra) == 40,
              "feed_apply.RECORD is '=b3xiqi4xqIIq'");

}  // namespace racecheck_log
