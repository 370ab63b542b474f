# distutils: language = c++
# cython: boundscheck=False, wraparound=False, initializedcheck=False
"""Hot loops of the GGUF tokenizers: the BPE merge loop and the SPM bigram loop.

Both follow llama.cpp's llama-vocab.cpp so that the ids are the same token for
token: symbols are UTF-8 characters, a binary heap picks the best pair (lowest
merge rank for BPE, highest score for SPM, leftmost on ties), stale pairs are
skipped when one side has changed since the pair was queued.

Strings cross this boundary as UTF-8 bytes; token texts are the GGUF bytes.
"""
from libc.stdint cimport int32_t, uint32_t, uint64_t
from libc.string cimport memcmp
from libcpp.string cimport string
from libcpp.vector cimport vector


cdef inline uint64_t _hash(const char * p, size_t n) noexcept nogil:
    # FNV-1a, then a 64-bit finalizer (splitmix64's) so the low bits the table uses mix well
    cdef uint64_t h = 14695981039346656037ULL
    cdef size_t i
    for i in range(n):
        h = (h ^ <unsigned char>p[i]) * 1099511628211ULL
    h = (h ^ (h >> 30)) * 0xBF58476D1CE4E5B9ULL
    h = (h ^ (h >> 27)) * 0x94D049BB133111EBULL
    return h ^ (h >> 31)


cdef class _TextTable:
    """Texts by index, found by their bytes: the texts end to end in one buffer and an
    open-addressing table of indices (load at most 0.6). A text held twice finds its lowest
    index, as a map's first insert wins. Qwen's 151,936 tokens: 3 MiB, where an
    unordered_map<string, int> of them took ~12 (bench/README.md, memory.py)."""

    cdef string blob
    cdef vector[uint32_t] starts      # text i is blob[starts[i]:starts[i + 1]]
    cdef vector[int32_t] slots        # -1: empty
    cdef uint64_t mask

    def __init__(self, list texts):
        cdef size_t n = len(texts)
        cdef size_t cap = 16
        cdef bytes t
        cdef int32_t i
        cdef uint64_t h
        while cap * 3 < n * 5:
            cap <<= 1
        self.slots.assign(cap, -1)
        self.mask = cap - 1
        self.blob.reserve(sum(len(t) for t in texts))
        self.starts.reserve(n + 1)
        self.starts.push_back(0)
        for i in range(<int32_t>n):
            t = texts[i]
            self.blob.append(<const char *>t, len(t))
            self.starts.push_back(<uint32_t>self.blob.size())
            h = self._slot(self.blob.data() + self.starts[i], len(t))
            if self.slots[h] < 0:
                self.slots[h] = i

    cdef inline uint64_t _slot(self, const char * p, size_t n) noexcept nogil:
        """The slot that holds this text, or the empty one where it would go."""
        cdef uint64_t h = _hash(p, n) & self.mask
        cdef int32_t i
        while True:
            i = self.slots[h]
            if i < 0:
                return h
            if self.starts[i + 1] - self.starts[i] == n and memcmp(self.blob.data() + self.starts[i], p, n) == 0:
                return h
            h = (h + 1) & self.mask

    cdef inline int32_t find(self, const char * p, size_t n) noexcept nogil:
        """The lowest index of this text, or -1."""
        return self.slots[self._slot(p, n)]

    @property
    def nbytes(self) -> int:
        return self.blob.capacity() + 4 * (self.starts.capacity() + self.slots.capacity())


cdef struct Symbol:
    int prev
    int next
    int start      # byte offset into the text
    int n          # byte length, 0 once merged into its left neighbour


cdef struct Pair:
    double key     # lower is better: BPE rank, or -score for SPM
    int left
    int right
    int size


cdef inline bint _before(const Pair & a, const Pair & b) nogil:
    return a.key < b.key or (a.key == b.key and a.left < b.left)


cdef void _push(vector[Pair] & heap, Pair p) nogil:
    heap.push_back(p)
    cdef size_t i = heap.size() - 1
    cdef size_t parent
    cdef Pair tmp
    while i > 0:
        parent = (i - 1) >> 1
        if not _before(heap[i], heap[parent]):
            break
        tmp = heap[i]
        heap[i] = heap[parent]
        heap[parent] = tmp
        i = parent


cdef Pair _pop(vector[Pair] & heap) nogil:
    cdef Pair top = heap[0]
    heap[0] = heap.back()
    heap.pop_back()
    cdef size_t n = heap.size()
    cdef size_t i = 0
    cdef size_t l, r, best
    cdef Pair tmp
    while True:
        l = 2 * i + 1
        r = l + 1
        best = i
        if l < n and _before(heap[l], heap[best]):
            best = l
        if r < n and _before(heap[r], heap[best]):
            best = r
        if best == i:
            break
        tmp = heap[i]
        heap[i] = heap[best]
        heap[best] = tmp
        i = best
    return top


cdef inline int _utf8_len(unsigned char c) nogil:
    # same lookup as llama.cpp's unicode_len_utf8: by the high nibble
    if c < 0xC0:
        return 1
    if c < 0xE0:
        return 2
    if c < 0xF0:
        return 3
    return 4


cdef void _split_chars(const string & text, vector[Symbol] & symbols) nogil:
    cdef int size = <int>text.size()
    cdef int offs = 0
    cdef int index = 0
    cdef int n
    cdef Symbol sym
    symbols.clear()
    while offs < size:
        n = _utf8_len(<unsigned char>text[offs])
        if n > size - offs:
            n = size - offs
        sym.start = offs
        sym.n = n
        offs += n
        sym.prev = index - 1
        sym.next = -1 if offs == size else index + 1
        index += 1
        symbols.push_back(sym)


cdef inline void _merge(vector[Symbol] & symbols, const Pair & p) nogil:
    symbols[p.left].n += symbols[p.right].n
    symbols[p.right].n = 0
    symbols[p.left].next = symbols[p.right].next
    if symbols[p.right].next >= 0:
        symbols[symbols[p.right].next].prev = p.left


cdef class BPECore:
    """Byte-level BPE over GPT-2 byte-encoded words (or raw UTF-8 words)."""

    cdef _TextTable vocab
    cdef _TextTable ranks
    cdef bint ignore_merges
    cdef bint has_byte_ids
    cdef int byte_ids[256]
    cdef vector[Symbol] symbols
    cdef vector[Pair] heap

    def __init__(self, list tokens, list merges, bint ignore_merges=False, list byte_ids=None):
        """tokens: token texts as bytes, by id; merges: b"left right" lines by rank;
        byte_ids: id per byte (-1 if none) for vocabularies whose unmatched pieces fall
        back to <0xXX> tokens (raw UTF-8 BPE, e.g. gemma-4); None: single-byte texts."""
        cdef int i
        self.vocab = _TextTable(tokens)     # first id wins, as llama.cpp's emplace
        self.ranks = _TextTable(merges)
        self.ignore_merges = ignore_merges
        self.has_byte_ids = byte_ids is not None
        for i in range(256):
            self.byte_ids[i] = byte_ids[i] if byte_ids is not None else -1

    @property
    def nbytes(self) -> int:
        """What its tables hold: the token texts and the merges, each with its index."""
        return self.vocab.nbytes + self.ranks.nbytes

    cdef void _try_pair(self, const string & word, int left, int right):
        if left == -1 or right == -1:
            return
        cdef Symbol a = self.symbols[left]
        cdef Symbol b = self.symbols[right]
        cdef string key = word.substr(a.start, a.n)
        key.push_back(32)  # ' '
        key.append(word.substr(b.start, b.n))
        cdef int32_t rank = self.ranks.find(key.data(), key.size())
        if rank < 0:
            return
        cdef Pair p
        p.key = rank
        p.left = left
        p.right = right
        p.size = a.n + b.n
        _push(self.heap, p)

    def encode_word(self, bytes word_bytes):
        """Token ids of one pre-tokenized (already byte-encoded) word."""
        cdef string word = word_bytes
        cdef list out = []
        cdef int i, j
        cdef Pair p
        cdef string piece
        cdef int32_t tid
        if self.ignore_merges:
            tid = self.vocab.find(word.data(), word.size())
            if tid >= 0:
                out.append(tid)
                return out
        _split_chars(word, self.symbols)
        self.heap.clear()
        for i in range(1, <int>self.symbols.size()):
            self._try_pair(word, i - 1, i)
        while self.heap.size() > 0:
            p = _pop(self.heap)
            if self.symbols[p.left].n == 0 or self.symbols[p.right].n == 0:
                continue
            if self.symbols[p.left].n + self.symbols[p.right].n != p.size:
                continue
            _merge(self.symbols, p)
            self._try_pair(word, self.symbols[p.left].prev, p.left)
            self._try_pair(word, p.left, self.symbols[p.left].next)
        i = 0 if self.symbols.size() > 0 else -1
        while i != -1:
            piece = word.substr(self.symbols[i].start, self.symbols[i].n)
            tid = self.vocab.find(piece.data(), piece.size())
            if tid >= 0:
                out.append(tid)
            elif self.has_byte_ids:
                for j in range(<int>piece.size()):
                    if self.byte_ids[<unsigned char>piece[j]] >= 0:
                        out.append(self.byte_ids[<unsigned char>piece[j]])
            else:
                # llama.cpp: look each byte of the piece up on its own, drop misses
                for j in range(<int>piece.size()):
                    tid = self.vocab.find(piece.data() + j, 1)
                    if tid >= 0:
                        out.append(tid)
            i = self.symbols[i].next
        return out


cdef class SPMCore:
    """SentencePiece-style merge by score with <0xXX> byte fallback."""

    cdef _TextTable vocab
    cdef vector[float] scores
    cdef int byte_ids[256]
    cdef vector[Symbol] symbols
    cdef vector[Pair] heap

    def __init__(self, list tokens, scores, list byte_ids):
        """tokens: texts as bytes by id; scores: float per id; byte_ids: id per byte (-1 if none)."""
        cdef int i
        self.vocab = _TextTable(tokens)
        for i in range(len(tokens)):
            self.scores.push_back(<float>scores[i])
        for i in range(256):
            self.byte_ids[i] = byte_ids[i]

    cdef void _try_pair(self, const string & text, int left, int right):
        if left == -1 or right == -1:
            return
        cdef Symbol a = self.symbols[left]
        cdef int size = a.n + self.symbols[right].n
        cdef int32_t tid = self.vocab.find(text.data() + a.start, size)
        if tid < 0:
            return
        cdef Pair p
        p.key = -<double>self.scores[tid]
        p.left = left
        p.right = right
        p.size = size
        _push(self.heap, p)

    def encode(self, bytes text_bytes):
        """Token ids of one text fragment (spaces already escaped to U+2581)."""
        cdef string text = text_bytes
        cdef list out = []
        cdef int i, j, b
        cdef Pair p
        cdef string piece
        cdef int32_t tid
        _split_chars(text, self.symbols)
        self.heap.clear()
        for i in range(1, <int>self.symbols.size()):
            self._try_pair(text, i - 1, i)
        while self.heap.size() > 0:
            p = _pop(self.heap)
            if self.symbols[p.left].n == 0 or self.symbols[p.right].n == 0:
                continue
            if self.symbols[p.left].n + self.symbols[p.right].n != p.size:
                continue
            _merge(self.symbols, p)
            self._try_pair(text, self.symbols[p.left].prev, p.left)
            self._try_pair(text, p.left, self.symbols[p.left].next)
        i = 0 if self.symbols.size() > 0 else -1
        while i != -1:
            piece = text.substr(self.symbols[i].start, self.symbols[i].n)
            tid = self.vocab.find(piece.data(), piece.size())
            if tid >= 0:
                out.append(tid)
            else:
                # a merged symbol is always a token, so this is one character
                # that is not: emit its bytes as byte tokens
                for j in range(<int>piece.size()):
                    b = self.byte_ids[<unsigned char>piece[j]]
                    if b < 0:
                        raise KeyError(f"no byte token for 0x{<unsigned char>piece[j]:02X}")
                    out.append(b)
            i = self.symbols[i].next
        return out
