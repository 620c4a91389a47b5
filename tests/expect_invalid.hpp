// Expects a callable to throw ubep::InvalidArgument whose message contains every given part.
#pragma once

#include <gtest/gtest.h>

#include <initializer_list>
#include <string>

#include "ubep/error.hpp"

namespace ubep::test {

template <typename Fn>
void expect_invalid(Fn&& fn, std::initializer_list<std::string> parts) {
  try {
    fn();
    ADD_FAILURE() << "no InvalidArgument thrown";
  } catch (const InvalidArgument& e) {
    const std::string msg = e.what();
    for (const std::string& p : parts)
      EXPECT_NE(msg.find(p), std::string::npos) << "message lacks '" << p << "': " << msg;
  }
}

template <typename Fn>
void expect_invalid(Fn&& fn, const std::string& part) {
  expect_invalid(std::forward<Fn>(fn), {part});
}

}  // namespace ubep::test
