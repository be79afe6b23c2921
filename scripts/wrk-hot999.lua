-- wrk: GET the rebate of one of the demo keys taobao 100001..100999 at random, as one of 10,000
-- App clients (so the per-client limit, 50/s each by default, never binds at these rates).
math.randomseed(42)

request = function()
  local id = 100000 + math.random(1, 999)
  return wrk.format("GET", "/api/v1/items/taobao/" .. id .. "/rebate",
    { ["x-client-id"] = "app-ios-" .. math.random(1, 10000) })
end
