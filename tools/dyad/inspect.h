// inspect.h: the parts of the `dyad` command that show what the services
// are doing: the peers list, transfers in flight, the Prometheus export of
// the counters, owner liveness for `dyad ls`, and the progress bar of
// `dyad consume` on a terminal. Single-threaded except where noted.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "dyad/client/dyad_client.hpp"

namespace dyad {
namespace cli {

// `dyad peers`: the services registered in the metadata store, each probed
// (bounded by `timeout_s`) by the local service.
int CmdPeers(double timeout_s, bool json);

// Every counter of `st` in Prometheus' text exposition format (HELP and
// TYPE lines, "dyad_" prefix, a rank label), plus identity, uptime and
// transfers in flight as gauges.
std::string PrometheusText(const client::ServiceStatus& st);

// The "transfers in flight" table of `dyad status` ("" when none).
std::string TransfersTable(const std::vector<client::Transfer>& transfers);

// Liveness of the services that own files, as the local service sees them
// (one bounded probe each), into `states`; ranks without a registration are
// absent. False when the service cannot tell (an older service without the
// peers request, or the store unreachable).
bool OwnerStates(client::Client& client, const std::vector<uint32_t>& ranks,
                 std::map<uint32_t, client::PeerState>* states);

// True when `dyad consume` may draw a progress bar: stdout and stderr are
// both terminals.
bool ProgressWanted();

// client.Consume(path, info) (`upath` is its path relative to the consumer
// directory), drawing a progress bar on stderr while the local service
// reports the file's transfer in flight. Uses a second thread for the
// consume.
client::Status ConsumeShowingProgress(client::Client& client, const std::string& path,
                                      const std::string& upath, client::ConsumeInfo* info);

}  // namespace cli
}  // namespace dyad
