-- wrk: GET the rebate of an item never asked for before: the demo catalogue (ids 100001–110000
-- on taobao, jd and pdd) walked in order, platform by platform, one new key a request, as one of
-- 10,000 App clients at random. One wrk thread: the walk is that thread's counter. About 30,000
-- keys, so keep runs short; delisted ids (≥ 101000, id % 500 = 123) answer 404.
math.randomseed(42)
local platforms = { "taobao", "jd", "pdd" }
local next_key = 0

request = function()
  local platform = platforms[(next_key % 3) + 1]
  local id = 100001 + math.floor(next_key / 3)
  next_key = next_key + 1
  return wrk.format("GET", "/api/v1/items/" .. platform .. "/" .. id .. "/rebate",
    { ["x-client-id"] = "app-ios-" .. math.random(1, 10000) })
end
