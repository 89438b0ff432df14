// host_id.h: whether two services can share memory directly.
//
// Transports that have a same-host path (UCX shared memory and cross-memory
// attach, libfabric's shm provider) exchange this value when a transfer
// starts and take that path only when both sides computed the same one.
#pragma once

#include <string>

namespace dyad {

// The boot id of this machine and the IPC, pid and mount namespaces of this
// process: equal values mean the same kernel and namespaces in which SysV
// and POSIX shared memory, /dev/shm and process_vm_readv reach each other.
// Computed once; "" when any part is unknown (then never equal: the caller
// takes its network path).
const std::string& SameHostId();

}  // namespace dyad
