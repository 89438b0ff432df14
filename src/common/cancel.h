// cancel.h: how long waits learn that nobody needs their answer any more.
#pragma once

#include <functional>

namespace dyad {

// Polled by long waits every so often (at most every 250 ms); returning true
// abandons the wait. Used to stop waiting for a client that went away or
// when the service is stopping.
using CancelFn = std::function<bool()>;

}  // namespace dyad
