-- SRPC case study "atomic directory update": many clients add entries to one shared
-- directory object (a file holding one name per line) under a server lock, so no update
-- is lost. Arguments: path of the directory object, name to add. Returns the entry count.
local path, name = ...
assert(lock.acquire("dir:" .. path, 2000), "could not lock " .. path)
local _, body = fs.get(path)
body = body or ""
body = body .. name .. "\n"
fs.put(path, 420, body)
local count = select(2, body:gsub("\n", ""))
lock.release("dir:" .. path)
return count
