-- AFS consistency (used by locus_client::consistency). Arguments: op, path.
-- "open": registers the caller for a callback on path and returns the file's attributes,
--         with its contents in the output buffer (one round trip).
-- "close": stores the input buffer as the new contents and breaks the callbacks of every
--          other client caching the file; returns how many were broken.
-- The callbacks are the file's own state (state.of), shared by every subject that may
-- read it; storing new contents replaces the file, so the callbacks kept move to it.
local op, path = ...
local key = "afs:" .. path
local me = msg.caller()
assert(lock.acquire(key, 2000), "busy: " .. path)
local file = state.of(path)
local holders = file and file:get("callbacks") or {}
if op == "open" then
  local known = false
  for _, c in ipairs(holders) do known = known or c == me end
  if file and not known then file:push("callbacks", me) end
  lock.release(key)
  local attr, data = fs.get(path)
  if not attr then return nil, data end
  output:append(data)
  return attr
end
local attr, err = fs.put(path, 420, input)
if not attr then
  lock.release(key)
  return nil, err
end
local broken, keep = 0, {}
for _, c in ipairs(holders) do
  if c == me then
    keep[#keep + 1] = c
  elseif msg.send(c, "break " .. path) then
    broken = broken + 1
  end
end
if #keep > 0 then assert(state.of(path)):set("callbacks", keep) end
lock.release(key)
return broken
