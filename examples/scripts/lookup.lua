-- SRPC case study "read+getattr": find a name in a directory and stat it, in one round
-- trip instead of two. Arguments: directory, name. Returns the child's attributes, or
-- nil and a message.
local dir, name = ...
local entries, err = fs.readdir(dir)
if not entries then return nil, err end
for _, e in ipairs(entries) do
  if e.name == name then
    return fs.stat(dir .. "/" .. name)
  end
end
return nil, "ENOENT: " .. name .. " is not in " .. dir
