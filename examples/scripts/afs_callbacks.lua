-- SRPC case study "AFS open / close-dirty": a caching client registers a callback on
-- open; a writer's close breaks the callbacks of every other caching client.
-- Arguments: "open" or "close", path. Returns how many callbacks were broken (on close).
local op, path = ...
local key = "callbacks:" .. path
local me = msg.caller()
if op == "open" then
  state.push(key, me)
  return true
end
local holders = state.take(key) or {}
local broken = 0
for _, client in ipairs(holders) do
  if client ~= me and msg.send(client, "break " .. path) then
    broken = broken + 1
  end
end
return broken
