-- Sprite consistency (used by locus_client::consistency). Arguments: op, path, mode.
-- "open" (mode "r" or "w"): records the open; when the file becomes write-shared (a
--   writer and another client have it open) every other opener is told to stop caching
--   it. Returns true if the caller may cache the file. Opening a missing file for
--   writing creates it, as open(O_CREAT) does.
-- "close": forgets the caller's opens of the file.
-- The opens are the file's own state (state.of), shared by every subject that may read it.
local op, path, mode = ...
local key = "sprite:" .. path
local me = msg.caller()
assert(lock.acquire(key, 2000), "busy: " .. path)
local file = state.of(path)
if not file and op == "open" and mode == "w" then
  local created = fs.open(path, 2 | 4, 420) -- WRITE | CREATE
  if created then fs.close(created.handle) end
  file = state.of(path)
end
local opens = file and file:get("opens") or {}
if op == "close" then
  local keep = {}
  for _, o in ipairs(opens) do
    if o.client ~= me then keep[#keep + 1] = o end
  end
  if file then file:set("opens", #keep > 0 and keep or nil) end
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
if file then file:set("opens", opens) end
lock.release(key)
return not shared
