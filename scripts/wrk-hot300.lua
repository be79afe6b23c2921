-- wrk: GET the rebate of one of the 300 hot demo keys (taobao 100001..100300) at random, as one
-- of 1,000 App clients.
math.randomseed(42)

request = function()
  local id = 100000 + math.random(1, 300)
  return wrk.format("GET", "/api/v1/items/taobao/" .. id .. "/rebate",
    { ["x-client-id"] = "app-ios-" .. math.random(1, 1000) })
end
