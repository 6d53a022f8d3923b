// TensorDict: order kept, unique names, lookup errors that name the key.
#include <catch2/catch.hpp>

#include "support.h"

using namespace kiln;
using namespace kiln::test;

TEST_CASE("TensorDict keeps insertion order, replaces with set, rejects duplicates") {
  TensorDict d{{"b", ones({2})}, {"a", zeros({3})}};
  d.insert("c", full({1}, 7.0));
  REQUIRE(d.keys() == std::vector<std::string>{"b", "a", "c"});
  CHECK(d.at("c").item<float>() == 7.0f);
  d.set("a", full({1}, 5.0));
  REQUIRE(d.keys() == std::vector<std::string>{"b", "a", "c"});
  CHECK(d.at("a").item<float>() == 5.0f);
  CHECK(d.contains("b"));
  CHECK_FALSE(d.contains("z"));
  check_error([&] { d.insert("b", ones({1})); }, {"'b' is already present", "set()"});
  check_error([&] { (void)d.at("zz"); }, {"no entry named 'zz'", "3 entries"});
}
