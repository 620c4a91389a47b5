// Buffer set-up: validate the config on every rank and agree on the verdict (config_agreement.cpp).
#pragma once

#include <cstdint>

#include "ubep/buffer.hpp"
#include "ubep/group.hpp"

namespace ubep::ep {

// Collective over the group; every rank enters it, whatever its own verdict. Returns the checked
// config (num_workers resolved). Throws InvalidArgument on every rank if any rank rejected its
// config (naming the value on that rank, the rank elsewhere) or if the ranks' configs differ.
BufferConfig agree_on_config(Group& g, const BufferConfig& requested);

// A digest (never 0) of the fields agree_on_config compares: a replacement that joins live ranks
// makes no collective, so its config is agreed through its membership record instead
// (MemberRecord::kConfig; a different digest is refused at its first dispatch, issue 32).
uint32_t config_digest(const BufferConfig& c);

}  // namespace ubep::ep
