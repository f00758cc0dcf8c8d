-- SRPC case study "AFS open / close-dirty": a caching client registers a callback on
-- open; a writer's close breaks the callbacks of every other caching client.
-- Arguments: "open" or "close", path. Returns how many callbacks were broken (on close).
-- The callbacks are the file's own state: they follow it across renames and go with it.
local op, path = ...
local file = assert(state.of(path))
local me = msg.caller()
if op == "open" then
  file:push("callbacks", me)
  return true
end
local holders = file:take("callbacks") or {}
local broken = 0
for _, client in ipairs(holders) do
  if client ~= me and msg.send(client, "break " .. path) then
    broken = broken + 1
  end
end
return broken
