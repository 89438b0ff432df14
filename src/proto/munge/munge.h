// munge.h: MUNGE credentials for the service handshake (common/auth.h).
//
// munged, running on every node with one key shared by the cluster, makes
// credentials that carry a payload and the uid/gid of the process that
// asked for them, and verifies them anywhere the key is known (integrity,
// expiry after its time-to-live, replay on the decoding node). DYAD puts the
// handshake transcript in the payload, so a credential proves "a process of
// uid U made this very handshake". Credentials are restricted to be decoded
// by processes of this uid only.
//
// Built on libmunge when it was found at configure time (DYAD_ENABLE_MUNGE);
// otherwise OpenMungeService explains that this build lacks MUNGE.
// Thread-safe: every call uses its own libmunge context.
#pragma once

#include <memory>
#include <string>

#include "common/status.h"
#include "proto/auth.h"

namespace dyad {

// True when this build can speak to munged.
bool MungeCompiledIn();

// Connects to munged at `socket_path` ("" = libmunge's default,
// /run/munge/munge.socket.2) and checks that it answers by encoding and
// decoding one credential. Errors name the socket and munged's reason.
Result<std::shared_ptr<const CredentialService>> OpenMungeService(const std::string& socket_path);

// The credentials and link protection a service uses with its peers.
struct ServiceCredentials {
  std::string secret;        // cluster secret ("" = none)
  bool munge = false;        // MUNGE credentials as well (or instead)
  std::string munge_socket;  // "" = libmunge's default
  LinkProtection protection = LinkProtection::kIntegrity;
};

// The Authenticator for `creds`; opens (and probes) munged when asked for.
Result<std::shared_ptr<const Authenticator>> OpenAuthenticator(const ServiceCredentials& creds);

}  // namespace dyad
