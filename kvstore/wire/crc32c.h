// CRC32C (Castagnoli), the checksum of sluice's page wire format. Uses the SSE4.2 crc32
// instruction when the CPU has it and a table otherwise. (Debian ships no C++ CRC32C library;
// Abseil gained one only after the version Debian 12 carries.)
#ifndef SLUICE_KVSTORE_WIRE_CRC32C_H_
#define SLUICE_KVSTORE_WIRE_CRC32C_H_

#include <cstddef>
#include <cstdint>

namespace sluice::kvstore {

// Extends `crc` (the CRC32C of earlier bytes, 0 to start) over data[0, n).
uint32_t Crc32c(const void* data, size_t n, uint32_t crc = 0);

// The table implementation, exposed so tests can compare both paths.
uint32_t Crc32cPortable(const void* data, size_t n, uint32_t crc = 0);

}  // namespace sluice::kvstore

#endif  // SLUICE_KVSTORE_WIRE_CRC32C_H_
