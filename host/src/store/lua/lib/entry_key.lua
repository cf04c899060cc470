-- Library: an entry's key (for ordered keys and dedupe), read from a stream field or from a
-- JSON pointer into that field's JSON.
--
-- The key: the field's value, or the value at the pointer in its JSON: a string as its text,
-- an integer (below 2^53) as its decimal digits, a boolean as `true`/`false`; anything else
-- (missing, null, a fraction, an object, an array, no JSON) is no key. A key longer than
-- max_key_bytes is none either.
--
-- Cost: the field is found by a scan of the entry's fields; a pointer decodes the field's
-- JSON once (cjson, whose depth is bounded at 1000) and walks at most its tokens.

-- The pointer's tokens, unescaped, each after a `/` (Lua 5.1's gmatch would add empty
-- matches); nil when the pointer is '' (the field itself is the key).
local function entry_key_tokens(pointer)
  if pointer == '' then
    return nil
  end
  local tokens = {}
  local from = 2
  while from <= #pointer + 1 do
    local slash = string.find(pointer, '/', from, true) or (#pointer + 1)
    local token = string.sub(pointer, from, slash - 1)
    tokens[#tokens + 1] = string.gsub(string.gsub(token, '~1', '/'), '~0', '~')
    from = slash + 1
  end
  return tokens
end

-- The key of the entry with `fields` (flat name, value, ...): the bytes, or nil and why not
-- ('missing' or 'too_long').
local function entry_key(fields, field, tokens, max_key_bytes)
  local value
  for i = 1, #fields, 2 do
    if fields[i] == field then
      value = fields[i + 1]
      break
    end
  end
  if value == nil then
    return nil, 'missing'
  end
  if tokens then
    local decoded, json = pcall(cjson.decode, value)
    if not decoded then
      return nil, 'missing'
    end
    for _, token in ipairs(tokens) do
      if type(json) ~= 'table' then
        return nil, 'missing'
      end
      local at = json[token]
      if at == nil and string.match(token, '^%d+$') then
        at = json[tonumber(token) + 1]
      end
      json = at
    end
    if type(json) == 'string' then
      value = json
    elseif type(json) == 'number' and json == math.floor(json) and math.abs(json) < 2 ^ 53 then
      value = string.format('%d', json)
    elseif type(json) == 'boolean' then
      value = tostring(json)
    else
      return nil, 'missing'
    end
  end
  if #value > max_key_bytes then
    return nil, 'too_long'
  end
  return value
end
