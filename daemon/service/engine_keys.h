// The engine's name for a client's key. Keys live in one namespace per user:
// the engine's key is a keyed 128-bit hash (XXH3 with a 192-byte secret) of
// the uid and the key as the client named it, so that a client can neither
// name nor find a key that lands on another uid's block or ghost. (It was
// the key XORed with a public function of the uid: any uid could compute
// the key that reached another uid's block, learn whether that uid held it,
// squat it, or take its ghost, score and all. Found by a helper's audit,
// 2026-12-07.) Engine keys are not shown to clients: Stats, status and the
// segment carry the client's own keys; recordings are for admins.
//
// The secret is drawn at the first start and kept in the state directory
// (`key-secret`, mode 0600) with the checkpoint, so that ghosts keep their
// keys across restarts; without persistence, each run draws its own.
#pragma once

#include <sys/types.h>

#include <array>
#include <cstdint>
#include <string>

#include "cxltier/block.h"
#include "cxltier/status.h"

namespace cxltier::service {

class EngineKeys {
 public:
  static constexpr size_t kSecretBytes = 192;
  using Secret = std::array<uint8_t, kSecretBytes>;

  EngineKeys();  // a secret of this run's own
  explicit EngineKeys(const Secret& secret) : secret_(secret) {}

  // Loads `dir`'s key-secret, or, when there is none, draws one and writes
  // it there (a new file, fsynced, renamed into place; if that fails, an
  // error: checkpoints made with a secret no later run has would lose every
  // ghost). A secret that is
  // not a regular file of kSecretBytes that only this user may read is
  // replaced by a new one (the ghosts saved under the old one are then not
  // found again: the safe way). Any other failure to read it is an error.
  // `created`, when given, says whether a new one was written.
  static Result<EngineKeys> InStateDir(const std::string& dir, bool* created = nullptr);
  // `dir`'s key-secret, or an error: never writes one.
  static Result<EngineKeys> Read(const std::string& dir);

  BlockKey Of(const BlockKey& key, uid_t uid) const;
  // The key of a ghost saved before the secret existed (before 2026-12-07),
  // whose engine key was the client's key XORed with a function of its
  // owner's uid: the client's key is taken back out, then made as Of makes
  // it. A daemon that draws its secret converts the checkpoint's ghosts of
  // known owners this way, so an upgrade keeps them.
  BlockKey FromUnkeyed(const BlockKey& unkeyed, uid_t owner) const;

 private:
  Secret secret_;
};

}  // namespace cxltier::service
