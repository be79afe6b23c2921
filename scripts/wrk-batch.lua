-- wrk: POST the batch body in the file given after `--` (scripts/wrk-paths.sh writes 50 hot-list
-- keys) to /api/v1/items:batch, as one of 10,000 App clients at random.
math.randomseed(42)
local body

init = function(args)
  local file = assert(io.open(args[1], "rb"), "usage: wrk … -s wrk-batch.lua URL -- BODY_FILE")
  body = file:read("*a")
  file:close()
end

request = function()
  return wrk.format("POST", "/api/v1/items:batch", {
    ["content-type"] = "application/json",
    ["x-client-id"] = "app-ios-" .. math.random(1, 10000),
  }, body)
end
