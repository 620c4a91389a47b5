// Internal alias of the public bf16 helpers.
#pragma once

#include "ubep/bf16.hpp"
