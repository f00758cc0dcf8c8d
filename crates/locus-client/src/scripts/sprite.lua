-- Sprite consistency (used by locus_client::consistency). Arguments: op, path, mode.
-- "open" (mode "r" or "w"): records the open; when the file becomes write-shared (a
--   writer and another client have it open) every other opener is told to stop caching
--   it. Returns true if the caller may cache the file.
-- "close": forgets the caller's opens of the file.
local op, path, mode = ...
local key = "sprite:" .. path
local me = msg.caller()
assert(lock.acquire(key, 2000), "busy: " .. path)
local opens = state.get(key) or {}
if op == "close" then
  local keep = {}
  for _, o in ipairs(opens) do
    if o.client ~= me then keep[#keep + 1] = o end
  end
  state.set(key, keep)
  lock.release(key)
  return true
end
opens[#opens + 1] = { client = me, mode = mode }
local writer, clients, seen = false, 0, {}
for _, o in ipairs(opens) do
  writer = writer or o.mode == "w"
  if not seen[o.client] then
    seen[o.client] = true
    clients = clients + 1
  end
end
local shared = writer and clients > 1
if shared then
  for c in pairs(seen) do
    if c ~= me then msg.send(c, "uncache " .. path) end
  end
end
state.set(key, opens)
lock.release(key)
return not shared
