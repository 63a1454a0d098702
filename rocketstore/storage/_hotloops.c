/* The store's per-message hot loops, compiled: the twins of
 *
 *   rocketstore/storage/codec.py                encode_records_py, place_records_py
 *   services/dispatcher/decode.py       walk_records_py
 *   services/index/index_file.py        index_key_hash_py, put_message_keys_py
 *   rocketstore/storage/message.py              java_string_hash
 *   rocketstore/rpc/tls_demux.py            pump_py (the port demultiplexer, at the end of this file)
 *
 * Each function here gives exactly the bytes and results of its Python twin, which stays the
 * reference and the fallback (tests/test_hot_loops_agree.py checks them against each other on random
 * input). Anything unusual is left to the Python code: encode_records answers None for a message it
 * does not encode, walk_records stops at a record it does not walk. The record layout is RocketMQ's V1
 * format as rocketstore/storage/codec.py names it; the positions below are those of a record with IPv4 hosts,
 * moved by 12 bytes for each IPv6 host.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

#define MESSAGE_MAGIC_CODE 0xDAA320A7u
#define END_FILE_MIN_BLANK_LENGTH 8
#define POS_QUEUEID 12
#define POS_FLAG 16
#define POS_QUEUEOFFSET 20
#define POS_PHYSICALOFFSET 28
#define POS_SYSFLAG 36
#define POS_BORNTIMESTAMP 40
#define POS_BORNHOST 48
#define POS_STORETIMESTAMP 56 /* + 12 with an IPv6 born host */
#define POS_BODYLEN 84        /* + 12 for each IPv6 host */
#define HOST_V6_EXTRA 12
#define MIN_RECORD_LENGTH 91
#define MAX_TOPIC_LENGTH 127
#define MAX_PROPERTIES_LENGTH 32767
#define RECORD_SIZE_SLACK (64 * 1024)
#define BORNHOST_V6_FLAG 0x10
#define STOREHOSTADDRESS_V6_FLAG 0x20
#define TRANSACTION_PREPARED_TYPE 0x4
#define TRANSACTION_ROLLBACK_TYPE 0xC
#define INDEX_HEADER_SIZE 40
#define HASH_SLOT_SIZE 4
#define INDEX_SIZE 20
#define INT_MAX32 0x7FFFFFFFLL
/* The whole-record CRC property (codec.PROPERTY_CRC32, CRC32_RESERVED_LEN): "__CRC32#" 0x01, 10 digits, 0x02. */
#define CRC32_PREFIX "__CRC32#\x01"
#define CRC32_PREFIX_LEN 9
#define CRC32_DIGITS 10
#define CRC32_RESERVED_LEN 20
static const char CRC32_TAIL_UNFILLED[CRC32_RESERVED_LEN + 1] = "__CRC32#\x01" "0000000000" "\x02";

static PyObject *str_topic, *str_body, *str_properties_text, *str_properties, *str_born_host, *str_sys_flag,
    *str_queue_id, *str_flag, *str_born_timestamp, *str_reconsume_times, *str_prepared_transaction_offset,
    *str_default_host, *str_schedule_topic, *str_tags, *str_keys, *str_uniq_key, *str_sep1, *str_sep2;

/* --- big-endian fields -------------------------------------------------------------------------- */
static inline void put32(unsigned char *p, uint32_t v) {
    p[0] = (unsigned char)(v >> 24); p[1] = (unsigned char)(v >> 16); p[2] = (unsigned char)(v >> 8);
    p[3] = (unsigned char)v;
}
static inline void put64(unsigned char *p, uint64_t v) { put32(p, (uint32_t)(v >> 32)); put32(p + 4, (uint32_t)v); }
static inline uint32_t get32(const unsigned char *p) {
    return ((uint32_t)p[0] << 24) | ((uint32_t)p[1] << 16) | ((uint32_t)p[2] << 8) | (uint32_t)p[3];
}
static inline uint64_t get64(const unsigned char *p) { return ((uint64_t)get32(p) << 32) | get32(p + 4); }

/* --- Java's String.hashCode over UTF-16 code units -------------------------------------------------- */
/* Feeds ``s`` into ``h``; -1 (with UnicodeEncodeError set, as Python's utf-16 encode raises) when ``s``
   holds a lone surrogate. */
static int hash_feed(PyObject *s, uint32_t *h) {
    int kind = PyUnicode_KIND(s);
    const void *data = PyUnicode_DATA(s);
    Py_ssize_t n = PyUnicode_GET_LENGTH(s);
    uint32_t v = *h;
    if (kind == PyUnicode_1BYTE_KIND) {
        const Py_UCS1 *d = (const Py_UCS1 *)data;
        for (Py_ssize_t i = 0; i < n; i++) v = 31u * v + d[i];
    } else {
        for (Py_ssize_t i = 0; i < n; i++) {
            Py_UCS4 c = PyUnicode_READ(kind, data, i);
            if (c < 0x10000) {
                if (c >= 0xD800 && c <= 0xDFFF) {
                    PyObject *r = PyUnicode_AsEncodedString(s, "utf-16-be", "strict");
                    Py_XDECREF(r);
                    if (!PyErr_Occurred()) PyErr_SetString(PyExc_UnicodeError, "lone surrogate");
                    return -1;
                }
                v = 31u * v + c;
            } else {
                c -= 0x10000;
                v = 31u * v + (0xD800 + (c >> 10));
                v = 31u * v + (0xDC00 + (c & 0x3FF));
            }
        }
    }
    *h = v;
    return 0;
}

/* IndexFile.indexKeyHashMethod: abs of the int32, 0 for Integer.MIN_VALUE. */
static inline uint32_t key_hash_of(uint32_t h) {
    if (h & 0x80000000u) {
        uint64_t a = (1ULL << 32) - h;
        return a > 0x7FFFFFFFu ? 0 : (uint32_t)a;
    }
    return h;
}

static PyObject *java_string_hash(PyObject *self, PyObject *arg) {
    if (!PyUnicode_Check(arg)) { PyErr_SetString(PyExc_TypeError, "a str is needed"); return NULL; }
    uint32_t h = 0;
    if (hash_feed(arg, &h) < 0) return NULL;
    return PyLong_FromLong((long)(int32_t)h);
}

static PyObject *index_key_hash(PyObject *self, PyObject *arg) {
    if (!PyUnicode_Check(arg)) { PyErr_SetString(PyExc_TypeError, "a str is needed"); return NULL; }
    uint32_t h = 0;
    if (hash_feed(arg, &h) < 0) return NULL;
    return PyLong_FromUnsignedLong(key_hash_of(h));
}

/* --- encode_records ----------------------------------------------------------------------------- */
/* An int attribute as a C long long; 0 when it is not one or does not fit (the message is declined). */
static int get_ll(PyObject *msg, PyObject *name, long long *out) {
    PyObject *v = PyObject_GetAttr(msg, name);
    if (v == NULL) return 0;
    if (!PyLong_Check(v)) { Py_DECREF(v); return 0; }
    int overflow = 0;
    *out = PyLong_AsLongLongAndOverflow(v, &overflow);
    Py_DECREF(v);
    if (overflow || (*out == -1 && PyErr_Occurred())) { PyErr_Clear(); return 0; }
    return 1;
}

static inline int fits32(long long v) { return v >= -2147483648LL && v <= 2147483647LL; }

/* The stored properties of a message without properties_text: "name\x01value\x02" for each pair of a
   dict of str whose value is not None. NULL (no error set) when this is not such a dict. */
static PyObject *properties_bytes(PyObject *props) {
    if (PyDict_CheckExact(props)) {
        if (PyDict_GET_SIZE(props) == 0) return PyBytes_FromStringAndSize(NULL, 0);
        Py_ssize_t total = 0, pos = 0;
        PyObject *k, *v;
        while (PyDict_Next(props, &pos, &k, &v)) {
            if (v == Py_None) continue;
            if (!PyUnicode_CheckExact(k) || !PyUnicode_CheckExact(v)) return NULL;
            Py_ssize_t kl, vl;
            if (PyUnicode_AsUTF8AndSize(k, &kl) == NULL || PyUnicode_AsUTF8AndSize(v, &vl) == NULL) {
                PyErr_Clear();
                return NULL;
            }
            total += kl + vl + 2;
        }
        PyObject *out = PyBytes_FromStringAndSize(NULL, total);
        if (out == NULL) { PyErr_Clear(); return NULL; }
        char *w = PyBytes_AS_STRING(out);
        pos = 0;
        while (PyDict_Next(props, &pos, &k, &v)) {
            if (v == Py_None) continue;
            Py_ssize_t kl, vl;
            const char *ks = PyUnicode_AsUTF8AndSize(k, &kl), *vs = PyUnicode_AsUTF8AndSize(v, &vl);
            memcpy(w, ks, kl); w += kl; *w++ = '\x01';
            memcpy(w, vs, vl); w += vl; *w++ = '\x02';
        }
        return out;
    }
    Py_ssize_t n = PyObject_Length(props);
    if (n == 0) return PyBytes_FromStringAndSize(NULL, 0);
    PyErr_Clear();
    return NULL;
}

/* Whether ``needle`` occurs in ``hay``. */
static int contains(const char *hay, Py_ssize_t n, const char *needle, Py_ssize_t m) {
    if (m > n) return 0;
    const char *end = hay + n - m + 1, *p = hay;
    while (p < end && (p = memchr(p, needle[0], (size_t)(end - p))) != NULL) {
        if (memcmp(p, needle, (size_t)m) == 0) return 1;
        p++;
    }
    return 0;
}

typedef struct {
    PyObject *host;   /* the last born host string parsed, and what parse_host made of it */
    PyObject *addr;
    long long port;
    int v6;
} HostCache;

/* One record, or Py_None (a new reference either way); NULL only on a real error (memory). */
static PyObject *encode_one(PyObject *msg, Py_ssize_t index, const char *store_addr, Py_ssize_t store_addr_len,
                            long long store_port, int store_v6, long long max_size, long long file_size,
                            PyObject *parse_host, PyObject *crc32, int append_prop_crc, HostCache *hc) {
    PyObject *topic = NULL, *body = NULL, *ptext = NULL, *props = NULL, *props_b = NULL, *host = NULL;
    PyObject *rec = NULL, *result = NULL, *queue_id_obj = NULL;
    long long queue_id, flag, sys_flag, born_ts, reconsume, prepared;

    topic = PyObject_GetAttr(msg, str_topic);
    if (topic == NULL || !PyUnicode_Check(topic)) goto decline;
    Py_ssize_t topic_len;
    const char *topic_s = PyUnicode_AsUTF8AndSize(topic, &topic_len);
    if (topic_s == NULL) goto decline;
    body = PyObject_GetAttr(msg, str_body);
    if (body == NULL || !PyBytes_CheckExact(body)) goto decline;
    Py_ssize_t body_len = PyBytes_GET_SIZE(body);

    ptext = PyObject_GetAttr(msg, str_properties_text);
    if (ptext == NULL) { PyErr_Clear(); }
    if (ptext != NULL && !PyUnicode_Check(ptext)) goto decline;
    if (ptext != NULL && PyUnicode_GET_LENGTH(ptext) > 0) {
        props = PyObject_GetAttr(msg, str_properties);
        if (props == NULL) goto decline;
        int truth = PyObject_IsTrue(props);
        if (truth != 0) goto decline;
        Py_ssize_t n = PyUnicode_GET_LENGTH(ptext);
        if (PyUnicode_READ_CHAR(ptext, n - 1) != 0x02) goto decline;
        Py_ssize_t c1 = PyUnicode_Count(ptext, str_sep1, 0, n), c2 = PyUnicode_Count(ptext, str_sep2, 0, n);
        if (c1 < 0 || c2 < 0 || c1 != c2) goto decline;
        props_b = PyUnicode_AsUTF8String(ptext);
        if (props_b == NULL) goto decline;
    } else {
        props = PyObject_GetAttr(msg, str_properties);
        if (props == NULL) goto decline;
        props_b = properties_bytes(props);
        if (props_b == NULL) goto decline;
    }
    Py_ssize_t props_len = PyBytes_GET_SIZE(props_b);
    /* A __CRC32# pair carried over from another record is removed by the Python path. */
    if (contains(PyBytes_AS_STRING(props_b), props_len, CRC32_PREFIX, CRC32_PREFIX_LEN)) goto decline;
    int crc_len = append_prop_crc ? CRC32_RESERVED_LEN : 0;
    int add_sep = crc_len && props_len > 0 && PyBytes_AS_STRING(props_b)[props_len - 1] != 0x02;
    Py_ssize_t props_total = props_len + add_sep + crc_len;

    host = PyObject_GetAttr(msg, str_born_host);
    if (host == NULL) goto decline;
    int host_truth = PyObject_IsTrue(host);
    if (host_truth < 0) goto decline;
    if (!host_truth) { Py_DECREF(host); host = Py_NewRef(str_default_host); }
    if (!PyUnicode_Check(host)) goto decline;
    if (hc->host == NULL || (hc->host != host && PyUnicode_Compare(hc->host, host) != 0)) {
        if (PyErr_Occurred()) goto decline;
        PyObject *parsed = PyObject_CallOneArg(parse_host, host);
        if (parsed == NULL) goto decline;
        if (!PyTuple_Check(parsed) || PyTuple_GET_SIZE(parsed) != 3 || !PyBytes_Check(PyTuple_GET_ITEM(parsed, 0))) {
            Py_DECREF(parsed);
            goto decline;
        }
        int overflow = 0;
        long long port = PyLong_AsLongLongAndOverflow(PyTuple_GET_ITEM(parsed, 1), &overflow);
        int v6 = PyObject_IsTrue(PyTuple_GET_ITEM(parsed, 2));
        if (overflow || PyErr_Occurred() || v6 < 0) { Py_DECREF(parsed); goto decline; }
        Py_XSETREF(hc->host, Py_NewRef(host));
        Py_XSETREF(hc->addr, Py_NewRef(PyTuple_GET_ITEM(parsed, 0)));
        hc->port = port;
        hc->v6 = v6;
        Py_DECREF(parsed);
    }
    int born_v6 = hc->v6;
    Py_ssize_t born_addr_len = PyBytes_GET_SIZE(hc->addr);
    if (born_addr_len != (born_v6 ? 16 : 4) || store_addr_len != (store_v6 ? 16 : 4)) goto decline;
    if (!fits32(hc->port) || !fits32(store_port)) goto decline;

    if (!get_ll(msg, str_sys_flag, &sys_flag) || !get_ll(msg, str_queue_id, &queue_id)
        || !get_ll(msg, str_flag, &flag) || !get_ll(msg, str_born_timestamp, &born_ts)
        || !get_ll(msg, str_reconsume_times, &reconsume)
        || !get_ll(msg, str_prepared_transaction_offset, &prepared)) goto decline;
    sys_flag &= ~(long long)(BORNHOST_V6_FLAG | STOREHOSTADDRESS_V6_FLAG);
    long long size = MIN_RECORD_LENGTH + (long long)body_len + topic_len + props_total;
    if (born_v6) { sys_flag |= BORNHOST_V6_FLAG; size += HOST_V6_EXTRA; }
    if (store_v6) { sys_flag |= STOREHOSTADDRESS_V6_FLAG; size += HOST_V6_EXTRA; }
    if (!(topic_len > 0 && topic_len <= MAX_TOPIC_LENGTH) || body_len > max_size || props_total > MAX_PROPERTIES_LENGTH
        || size > max_size + RECORD_SIZE_SLACK || queue_id < 0 || queue_id > INT_MAX32) goto decline;
    if (!fits32(flag) || !fits32(sys_flag) || !fits32(reconsume) || !fits32(size)) goto decline;
    if (size + END_FILE_MIN_BLANK_LENGTH > file_size) goto decline;

    uint32_t crc = 0;
    if (body_len) {
        PyObject *c = PyObject_CallOneArg(crc32, body);
        if (c == NULL) goto fail;
        crc = (uint32_t)(PyLong_AsUnsignedLongMask(c) & 0x7FFFFFFFu);
        Py_DECREF(c);
        if (PyErr_Occurred()) goto fail;
    }
    rec = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)size);
    if (rec == NULL) goto fail;
    unsigned char *w = (unsigned char *)PyBytes_AS_STRING(rec);
    put32(w, (uint32_t)size);
    put32(w + 4, MESSAGE_MAGIC_CODE);
    put32(w + 8, crc);
    put32(w + POS_QUEUEID, (uint32_t)queue_id);
    put32(w + POS_FLAG, (uint32_t)flag);
    put64(w + POS_QUEUEOFFSET, 0);
    put64(w + POS_PHYSICALOFFSET, 0);
    put32(w + POS_SYSFLAG, (uint32_t)sys_flag);
    put64(w + POS_BORNTIMESTAMP, (uint64_t)born_ts);
    unsigned char *p = w + POS_BORNHOST;
    memcpy(p, PyBytes_AS_STRING(hc->addr), born_addr_len); p += born_addr_len;
    put32(p, (uint32_t)hc->port); p += 4;
    put64(p, 0); p += 8; /* STORETIMESTAMP: placed under the lock */
    memcpy(p, store_addr, store_addr_len); p += store_addr_len;
    put32(p, (uint32_t)store_port); p += 4;
    put32(p, (uint32_t)reconsume); p += 4;
    put64(p, (uint64_t)prepared); p += 8;
    put32(p, (uint32_t)body_len); p += 4;
    memcpy(p, PyBytes_AS_STRING(body), body_len); p += body_len;
    *p++ = (unsigned char)topic_len;
    memcpy(p, topic_s, topic_len); p += topic_len;
    *p++ = (unsigned char)(props_total >> 8); *p++ = (unsigned char)props_total;
    memcpy(p, PyBytes_AS_STRING(props_b), props_len); p += props_len;
    if (add_sep) *p++ = 0x02;
    if (crc_len) memcpy(p, CRC32_TAIL_UNFILLED, CRC32_RESERVED_LEN);

    unsigned int low = (unsigned int)(sys_flag & 0xFF);
    unsigned int tx = low & TRANSACTION_ROLLBACK_TYPE;
    int takes = tx != TRANSACTION_PREPARED_TYPE && tx != TRANSACTION_ROLLBACK_TYPE;
    queue_id_obj = PyObject_GetAttr(msg, str_queue_id);
    if (queue_id_obj == NULL) goto fail;
    result = Py_BuildValue("(nNL(OO)Oi)", index, rec, size, topic, queue_id_obj, takes ? Py_True : Py_False,
                           POS_STORETIMESTAMP + (born_v6 ? HOST_V6_EXTRA : 0));
    rec = NULL; /* stolen by N */
    goto done;

decline:
    PyErr_Clear();
    result = Py_NewRef(Py_None);
    goto done;
fail:
    result = NULL;
done:
    Py_XDECREF(topic); Py_XDECREF(body); Py_XDECREF(ptext); Py_XDECREF(props); Py_XDECREF(props_b);
    Py_XDECREF(host); Py_XDECREF(rec); Py_XDECREF(queue_id_obj);
    return result;
}

static PyObject *encode_records(PyObject *self, PyObject *args) {
    PyObject *msgs, *parse_host, *crc32;
    const char *store_addr;
    Py_ssize_t store_addr_len;
    long long store_port, max_size, file_size;
    int store_v6, append_prop_crc = 0;
    if (!PyArg_ParseTuple(args, "Oy#LpLLOO|p", &msgs, &store_addr, &store_addr_len, &store_port, &store_v6,
                          &max_size, &file_size, &parse_host, &crc32, &append_prop_crc)) return NULL;
    PyObject *seq = PySequence_Fast(msgs, "msgs must be a sequence");
    if (seq == NULL) return NULL;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    PyObject *out = PyList_New(n);
    HostCache hc = {NULL, NULL, 0, 0};
    if (out == NULL) goto error;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *r = encode_one(PySequence_Fast_GET_ITEM(seq, i), i, store_addr, store_addr_len, store_port,
                                 store_v6, max_size, file_size, parse_host, crc32, append_prop_crc, &hc);
        if (r == NULL) { Py_CLEAR(out); goto error; }
        PyList_SET_ITEM(out, i, r);
    }
error:
    Py_XDECREF(hc.host); Py_XDECREF(hc.addr);
    Py_DECREF(seq);
    return out;
}

/* --- place_records ------------------------------------------------------------------------------ */
static int set_ll(PyObject *list, Py_ssize_t i, long long v) {
    PyObject *o = PyLong_FromLongLong(v);
    if (o == NULL) return -1;
    return PyList_SetItem(list, i, o);
}

/* codec.fill_record_crc: ``crc32`` (zlib.crc32) over the record's bytes before its reserved property, masked,
   written as that property with the digits least significant first. */
static int fill_record_crc(unsigned char *w, long long size, PyObject *crc32) {
    PyObject *mv = PyMemoryView_FromMemory((char *)w, (Py_ssize_t)(size - CRC32_RESERVED_LEN), PyBUF_READ);
    if (mv == NULL) return -1;
    PyObject *c = PyObject_CallOneArg(crc32, mv);
    Py_DECREF(mv);
    if (c == NULL) return -1;
    unsigned long crc = PyLong_AsUnsignedLongMask(c) & 0x7FFFFFFFul;
    Py_DECREF(c);
    if (PyErr_Occurred()) return -1;
    unsigned char *t = w + size - CRC32_RESERVED_LEN;
    memcpy(t, CRC32_PREFIX, CRC32_PREFIX_LEN);
    for (int k = 0; k < CRC32_DIGITS; k++) { t[CRC32_PREFIX_LEN + k] = (unsigned char)('0' + crc % 10); crc /= 10; }
    t[CRC32_RESERVED_LEN - 1] = 0x02;
    return 0;
}

static PyObject *place_records(PyObject *self, PyObject *args) {
    PyObject *bufobj, *records, *table, *wrote_offsets, *sizes, *queue_offsets, *crc32 = Py_None;
    Py_ssize_t start;
    long long shift, base, pos, file_size, now;
    if (!PyArg_ParseTuple(args, "OLO!nO!LLLLO!O!O!|O", &bufobj, &shift, &PyList_Type, &records, &start,
                          &PyDict_Type, &table, &base, &pos, &file_size, &now, &PyList_Type, &wrote_offsets,
                          &PyList_Type, &sizes, &PyList_Type, &queue_offsets, &crc32)) return NULL;
    long long min_size = crc32 == Py_None ? 0 : CRC32_RESERVED_LEN;
    Py_buffer view;
    if (PyObject_GetBuffer(bufobj, &view, PyBUF_WRITABLE) < 0) return NULL;
    unsigned char *buf = (unsigned char *)view.buf;
    Py_ssize_t n = PyList_GET_SIZE(records), i = start;
    long long end_room = file_size - END_FILE_MIN_BLANK_LENGTH;
    for (; i < n; i++) {
        PyObject *r = PyList_GET_ITEM(records, i);
        if (!PyTuple_Check(r) || PyTuple_GET_SIZE(r) != 6) { PyErr_SetString(PyExc_TypeError, "bad record tuple"); goto error; }
        Py_ssize_t index = PyLong_AsSsize_t(PyTuple_GET_ITEM(r, 0));
        PyObject *rec = PyTuple_GET_ITEM(r, 1);
        long long size = PyLong_AsLongLong(PyTuple_GET_ITEM(r, 2));
        PyObject *key = PyTuple_GET_ITEM(r, 3);
        int takes = PyObject_IsTrue(PyTuple_GET_ITEM(r, 4));
        long long ts_pos = PyLong_AsLongLong(PyTuple_GET_ITEM(r, 5));
        if (PyErr_Occurred() || takes < 0) goto error;
        if (pos + size > end_room) break;
        if (!PyBytes_Check(rec) || PyBytes_GET_SIZE(rec) != size || ts_pos < 0 || ts_pos + 8 > size - min_size) {
            PyErr_SetString(PyExc_ValueError, "a record's size or store-timestamp position does not match it");
            goto error;
        }
        long long at = pos - shift;
        if (at < 0 || at + size > (long long)view.len) { PyErr_SetString(PyExc_IndexError, "record outside the buffer"); goto error; }
        long long queue_offset = 0;
        if (takes) {
            PyObject *cur = PyDict_GetItemWithError(table, key);
            if (cur == NULL && PyErr_Occurred()) goto error;
            if (cur != NULL) { queue_offset = PyLong_AsLongLong(cur); if (PyErr_Occurred()) goto error; }
            PyObject *next = PyLong_FromLongLong(queue_offset + 1);
            if (next == NULL || PyDict_SetItem(table, key, next) < 0) { Py_XDECREF(next); goto error; }
            Py_DECREF(next);
        }
        unsigned char *w = buf + at;
        memcpy(w, PyBytes_AS_STRING(rec), size);
        put64(w + POS_QUEUEOFFSET, (uint64_t)queue_offset);
        put64(w + POS_PHYSICALOFFSET, (uint64_t)(base + pos));
        put64(w + ts_pos, (uint64_t)now);
        if (crc32 != Py_None && fill_record_crc(w, size, crc32) < 0) goto error;
        if (set_ll(wrote_offsets, index, base + pos) < 0 || set_ll(sizes, index, size) < 0
            || set_ll(queue_offsets, index, queue_offset) < 0) goto error;
        pos += size;
    }
    PyBuffer_Release(&view);
    return Py_BuildValue("(nL)", i, pos);
error:
    PyBuffer_Release(&view);
    return NULL;
}

/* --- walk_records ------------------------------------------------------------------------------- */
/* property_value(text, name) or "": the value of the first "name\x01" at the start or after a "\x02". */
static PyObject *property_or_empty(PyObject *text, PyObject *prefix) {
    Py_ssize_t n = PyUnicode_GET_LENGTH(text), plen = PyUnicode_GET_LENGTH(prefix), start = 0;
    while (1) {
        Py_ssize_t i = PyUnicode_Find(text, prefix, start, n, 1);
        if (i == -2) return NULL;
        if (i < 0) return PyUnicode_New(0, 0);
        if (i == 0 || PyUnicode_READ_CHAR(text, i - 1) == 0x02) {
            Py_ssize_t j = PyUnicode_FindChar(text, 0x02, i, n, 1);
            if (j == -2) return NULL;
            return PyUnicode_Substring(text, i + plen, j < 0 ? n : j);
        }
        start = i + 1;
    }
}

static PyObject *walk_records(PyObject *self, PyObject *args) {
    PyObject *bufobj, *cols;
    long long pos, limit, base;
    if (!PyArg_ParseTuple(args, "OLLLO!", &bufobj, &pos, &limit, &base, &PyTuple_Type, &cols)) return NULL;
    if (PyTuple_GET_SIZE(cols) != 10) { PyErr_SetString(PyExc_ValueError, "ten columns are needed"); return NULL; }
    PyObject *c[10];
    for (int k = 0; k < 10; k++) {
        c[k] = PyTuple_GET_ITEM(cols, k);
        if (!PyList_Check(c[k])) { PyErr_SetString(PyExc_TypeError, "columns must be lists"); return NULL; }
    }
    Py_buffer view;
    if (PyObject_GetBuffer(bufobj, &view, PyBUF_SIMPLE) < 0) return NULL;
    const unsigned char *buf = (const unsigned char *)view.buf;
    if (limit > (long long)view.len) limit = view.len;
    long long last_ts = 0;
    PyObject *topic = NULL; /* the last topic decoded: records of one topic share it */
    while (limit - pos >= MIN_RECORD_LENGTH) {
        const unsigned char *r = buf + pos;
        int32_t total = (int32_t)get32(r);
        uint32_t magic = get32(r + 4);
        long long end = pos + total;
        if (magic != MESSAGE_MAGIC_CODE || total < MIN_RECORD_LENGTH || end > limit) break;
        int32_t queue_id = (int32_t)get32(r + POS_QUEUEID);
        int64_t queue_offset = (int64_t)get64(r + POS_QUEUEOFFSET);
        int64_t physical = (int64_t)get64(r + POS_PHYSICALOFFSET);
        int32_t sys_flag = (int32_t)get32(r + POS_SYSFLAG);
        int hosts = (sys_flag >> 4) & 3;
        long long p = pos + POS_BODYLEN + HOST_V6_EXTRA * ((hosts & 1) + (hosts >> 1));
        int32_t body_len = (int32_t)get32(buf + p);
        if (body_len < 0) break;
        p += 4 + (long long)body_len;
        if (p + 1 + 2 > end || physical != base + pos) break;
        long long topic_len = buf[p];
        p += 1;
        long long p_props = p + topic_len;
        if (p_props + 2 > end) break;
        int16_t props_len = (int16_t)(((uint16_t)buf[p_props] << 8) | buf[p_props + 1]);
        if (props_len < 0 || p_props + 2 + props_len != end) break;
        if (topic == NULL || PyUnicode_GET_LENGTH(topic) != topic_len || !PyUnicode_IS_ASCII(topic)
            || memcmp(PyUnicode_DATA(topic), buf + p, topic_len) != 0) {
            PyObject *t = PyUnicode_DecodeUTF8((const char *)buf + p, topic_len, NULL);
            if (t == NULL) { PyErr_Clear(); break; }
            Py_XSETREF(topic, t);
        }
        int cmp = PyUnicode_Compare(topic, str_schedule_topic);
        if (cmp == 0) break;
        PyObject *props = NULL, *tags = NULL, *keys = NULL, *uniq = NULL;
        long tags_code = 0;
        if (props_len) {
            props = PyUnicode_DecodeUTF8((const char *)buf + p_props + 2, props_len, NULL);
            if (props == NULL) { PyErr_Clear(); break; }
            tags = property_or_empty(props, str_tags);
            keys = tags ? property_or_empty(props, str_keys) : NULL;
            uniq = keys ? property_or_empty(props, str_uniq_key) : NULL;
            if (uniq == NULL) goto error_props;
            if (PyUnicode_GET_LENGTH(tags)) {
                uint32_t h = 0;
                if (hash_feed(tags, &h) < 0) goto error_props;
                tags_code = (long)(int32_t)h;
            }
        } else {
            keys = PyUnicode_New(0, 0);
            uniq = PyUnicode_New(0, 0);
            if (keys == NULL || uniq == NULL) goto error_props;
        }
        int64_t store_ts = (int64_t)get64(r + POS_STORETIMESTAMP + ((hosts & 1) ? HOST_V6_EXTRA : 0));
        PyObject *vals[10];
        vals[0] = Py_NewRef(topic);
        vals[1] = PyLong_FromLong(queue_id);
        vals[2] = PyLong_FromLongLong(queue_offset);
        vals[3] = PyLong_FromLongLong(physical);
        vals[4] = PyLong_FromLong(total);
        vals[5] = PyLong_FromLong(tags_code);
        vals[6] = PyLong_FromLongLong(store_ts);
        vals[7] = PyLong_FromLong(sys_flag);
        vals[8] = keys;
        vals[9] = uniq;
        keys = uniq = NULL;
        int bad = 0;
        for (int k = 0; k < 10; k++) {
            if (vals[k] == NULL || PyList_Append(c[k], vals[k]) < 0) bad = 1;
            Py_XDECREF(vals[k]);
        }
        Py_XDECREF(props); Py_XDECREF(tags);
        if (bad) goto error;
        last_ts = store_ts;
        pos = end;
        continue;
    error_props:
        Py_XDECREF(props); Py_XDECREF(tags); Py_XDECREF(keys); Py_XDECREF(uniq);
        goto error;
    }
    Py_XDECREF(topic);
    PyBuffer_Release(&view);
    return Py_BuildValue("(LL)", pos, last_ts);
error:
    Py_XDECREF(topic);
    PyBuffer_Release(&view);
    return NULL;
}

/* --- put_message_keys --------------------------------------------------------------------------- */
static PyObject *put_message_keys(PyObject *self, PyObject *args) {
    PyObject *mmobj, *topics_o, *keys_o, *uniq_o, *phys_o, *stamps_o, *flags_o;
    long long hash_slot_num, index_base, index_num, count, slots_used, begin_ts, skip_below;
    Py_ssize_t start, stop;
    if (!PyArg_ParseTuple(args, "OLLLLLLOOOOOOnnL", &mmobj, &hash_slot_num, &index_base, &index_num, &count,
                          &slots_used, &begin_ts, &topics_o, &keys_o, &uniq_o, &phys_o, &stamps_o, &flags_o, &start,
                          &stop, &skip_below)) return NULL;
    if (hash_slot_num <= 0) { PyErr_SetString(PyExc_ValueError, "hash_slot_num must be positive"); return NULL; }
    PyObject *seqs[6] = {NULL, NULL, NULL, NULL, NULL, NULL};
    PyObject *srcs[6] = {topics_o, keys_o, uniq_o, phys_o, stamps_o, flags_o};
    Py_buffer view;
    int have_view = 0;
    PyObject *result = NULL;
    for (int k = 0; k < 6; k++) {
        seqs[k] = PySequence_Fast(srcs[k], "columns must be sequences");
        if (seqs[k] == NULL) goto done;
        if (PySequence_Fast_GET_SIZE(seqs[k]) < stop) { PyErr_SetString(PyExc_IndexError, "column too short"); goto done; }
    }
    if (PyObject_GetBuffer(mmobj, &view, PyBUF_WRITABLE) < 0) goto done;
    have_view = 1;
    unsigned char *mm = (unsigned char *)view.buf;
    long long mm_len = view.len;
    long long end_phy = -1, end_ts = 0;
    Py_ssize_t i = start;
    PyObject *last_topic = NULL;
    uint32_t topic_state = 0; /* String.hashCode state after "topic#" */
    for (; i < stop; i++) {
        long long phy = PyLong_AsLongLong(PySequence_Fast_GET_ITEM(seqs[3], i));
        long long flag = PyLong_AsLongLong(PySequence_Fast_GET_ITEM(seqs[5], i));
        if (PyErr_Occurred()) goto done;
        if (phy < skip_below || (flag & TRANSACTION_ROLLBACK_TYPE) == TRANSACTION_ROLLBACK_TYPE) continue;
        PyObject *uniq = PySequence_Fast_GET_ITEM(seqs[2], i), *keys = PySequence_Fast_GET_ITEM(seqs[1], i);
        PyObject *topic = PySequence_Fast_GET_ITEM(seqs[0], i);
        if (!PyUnicode_Check(uniq) || !PyUnicode_Check(keys) || !PyUnicode_Check(topic)) {
            PyErr_SetString(PyExc_TypeError, "topics, keys and unique keys must be str");
            goto done;
        }
        /* how many keys: the unique key, then each non-empty token of KEYS split by " " */
        int kkind = PyUnicode_KIND(keys);
        const void *kdata = PyUnicode_DATA(keys);
        Py_ssize_t klen = PyUnicode_GET_LENGTH(keys), tokens = 0;
        for (Py_ssize_t j = 0; j < klen; j++) {
            if (PyUnicode_READ(kkind, kdata, j) != ' ' && (j == 0 || PyUnicode_READ(kkind, kdata, j - 1) == ' ')) tokens++;
        }
        long long nkeys = tokens + (PyUnicode_GET_LENGTH(uniq) > 0);
        if (count + nkeys > index_num) break;
        if (nkeys == 0) continue;
        long long ts = PyLong_AsLongLong(PySequence_Fast_GET_ITEM(seqs[4], i));
        if (PyErr_Occurred()) goto done;
        long long time_diff = 0;
        if (begin_ts > 0) {
            long long d = ts - begin_ts;
            /* Python's floor division; any negative result becomes 0 */
            time_diff = d < 0 ? 0 : d / 1000;
            if (time_diff > INT_MAX32) time_diff = INT_MAX32;
        }
        if (topic != last_topic) {
            topic_state = 0;
            if (hash_feed(topic, &topic_state) < 0) goto done;
            topic_state = 31u * topic_state + '#';
            last_topic = topic;
        }
        Py_ssize_t cursor = 0; /* where the next token of KEYS is looked for */
        for (long long kk = 0; kk < nkeys; kk++) {
            uint32_t h = topic_state;
            if (kk == 0 && PyUnicode_GET_LENGTH(uniq) > 0) {
                if (hash_feed(uniq, &h) < 0) goto done;
            } else {
                while (cursor < klen && PyUnicode_READ(kkind, kdata, cursor) == ' ') cursor++;
                Py_ssize_t tok_end = cursor;
                while (tok_end < klen && PyUnicode_READ(kkind, kdata, tok_end) != ' ') tok_end++;
                PyObject *token = PyUnicode_Substring(keys, cursor, tok_end);
                if (token == NULL) goto done;
                int rc = hash_feed(token, &h);
                Py_DECREF(token);
                if (rc < 0) goto done;
                cursor = tok_end;
            }
            uint32_t key_hash = key_hash_of(h);
            long long slot_pos = INDEX_HEADER_SIZE + (long long)(key_hash % (uint64_t)hash_slot_num) * HASH_SLOT_SIZE;
            long long entry_pos = index_base + count * INDEX_SIZE;
            if (slot_pos + 4 > mm_len || entry_pos + INDEX_SIZE > mm_len) {
                PyErr_SetString(PyExc_IndexError, "index file position out of range");
                goto done;
            }
            int32_t slot_value = (int32_t)get32(mm + slot_pos);
            if (slot_value <= 0 || slot_value > count) { slot_value = 0; slots_used++; }
            put32(mm + entry_pos, key_hash);
            put64(mm + entry_pos + 4, (uint64_t)phy);
            put32(mm + entry_pos + 12, (uint32_t)time_diff);
            put32(mm + entry_pos + 16, (uint32_t)slot_value);
            put32(mm + slot_pos, (uint32_t)count);
            count++;
        }
        end_phy = phy;
        end_ts = ts;
    }
    result = Py_BuildValue("(nLLLL)", i, count, slots_used, end_phy, end_ts);
done:
    if (have_view) PyBuffer_Release(&view);
    for (int k = 0; k < 6; k++) Py_XDECREF(seqs[k]);
    return result;
}


/* ---------------------------------------------------------------------------------------------------
 * The port demultiplexer's pump (rocketstore/rpc/tls_demux.py; its Python twin is tls_demux.pump_py).
 *
 * One thread, off the GIL, owns one listening socket: it accepts, peeks the first byte of each new
 * connection (0x16, a TLS handshake record, goes to the TLS backend; anything else, such as HTTP/2's
 * "PRI * HTTP/2.0" preface, to the plaintext one), connects to that backend on 127.0.0.1 from a port it
 * binds first (unique, so the backend's view of the peer names this connection alone) and records the
 * client's address for that port in `peers`, then moves bytes both ways with recv/send. Bytes go
 * through one scratch buffer; only what a peer could not take at once is kept, per direction, and its
 * source is not read again until it is gone, so a slow reader holds no more than one read.
 * A connection that sends nothing for `pending_ms` is closed. The control pipe says 'a' (stop
 * accepting) and 'q' (close everything and return).
 */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdlib.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#define PUMP_SCRATCH (256 * 1024)
#define PEER_ENTRY 20 /* family (4 or 6, 0: none), port (2 bytes, big-endian), address (4 or 16 bytes) */
#define TLS_RECORD_HANDSHAKE 0x16

enum { SIDE_CLIENT = 0, SIDE_BACKEND = 1 };
enum { ST_PENDING, ST_CONNECTING, ST_OPEN };

struct pump_conn;
struct pump_tag { struct pump_conn *conn; int side; };
struct pump_conn {
    int fd[2];
    int state;
    int read_done[2];        /* side sent FIN */
    char *held[2];           /* bytes read from side, not yet taken by the other side */
    size_t held_off[2], held_len[2];
    unsigned short port;     /* source port of the backend connection (its peers entry) */
    long long deadline_ms;   /* pending: closed if silent until then */
    struct pump_conn *prev, *next; /* pending list, oldest first */
    struct pump_conn *all_prev, *all_next; /* every connection, to close them all at the end */
    int closing;
    struct pump_tag tag[2];
    uint32_t interest[2];
};

struct pump {
    int ep, listen_fd, control_fd, plain_port, tls_port;
    long long pending_ms;
    unsigned char *peers;
    Py_ssize_t peers_len;
    struct pump_conn *pending_head, *pending_tail, *all;
    char *scratch;
    unsigned long long accepted_tls, accepted_plain;
    int live;
};

static long long now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (long long)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static void pending_unlink(struct pump *p, struct pump_conn *c) {
    if (c->prev) c->prev->next = c->next; else if (p->pending_head == c) p->pending_head = c->next;
    if (c->next) c->next->prev = c->prev; else if (p->pending_tail == c) p->pending_tail = c->prev;
    c->prev = c->next = NULL;
}

static void conn_close(struct pump *p, struct pump_conn *c) {
    if (c->state == ST_PENDING) pending_unlink(p, c);
    for (int s = 0; s < 2; s++) {
        if (c->fd[s] >= 0) close(c->fd[s]); /* also leaves the epoll set */
        free(c->held[s]);
    }
    if (c->port && (Py_ssize_t)(c->port + 1) * PEER_ENTRY <= p->peers_len) p->peers[c->port * PEER_ENTRY] = 0;
    if (c->all_prev) c->all_prev->all_next = c->all_next; else p->all = c->all_next;
    if (c->all_next) c->all_next->all_prev = c->all_prev;
    p->live--;
    free(c);
}

/* What side s waits for: its bytes while nothing of it is held and it is still sending, room for the
 * other side's held bytes. */
static void conn_watch(struct pump *p, struct pump_conn *c, int s) {
    uint32_t want = 0;
    if (c->state == ST_OPEN) {
        if (!c->held[s] && !c->read_done[s]) want |= EPOLLIN;
        if (c->held[1 - s]) want |= EPOLLOUT;
    } else if (c->state == ST_CONNECTING && s == SIDE_BACKEND) {
        want = EPOLLOUT;
    }
    if (want != c->interest[s]) {
        struct epoll_event ev = {.events = want, .data.ptr = &c->tag[s]};
        epoll_ctl(p->ep, EPOLL_CTL_MOD, c->fd[s], &ev);
        c->interest[s] = want;
    }
}

static void record_peer(struct pump *p, unsigned short port, struct sockaddr_storage *addr) {
    if ((Py_ssize_t)(port + 1) * PEER_ENTRY > p->peers_len) return;
    unsigned char *e = p->peers + port * PEER_ENTRY;
    if (addr->ss_family == AF_INET) {
        struct sockaddr_in *a = (struct sockaddr_in *)addr;
        memcpy(e + 1, &a->sin_port, 2);
        memcpy(e + 3, &a->sin_addr, 4);
        e[0] = 4;
    } else if (addr->ss_family == AF_INET6) {
        struct sockaddr_in6 *a = (struct sockaddr_in6 *)addr;
        memcpy(e + 1, &a->sin6_port, 2);
        memcpy(e + 3, &a->sin6_addr, 16);
        e[0] = 6;
    }
}

/* The first byte arrived: connect to the backend it names. */
static int conn_route(struct pump *p, struct pump_conn *c) {
    unsigned char first;
    ssize_t n = recv(c->fd[SIDE_CLIENT], &first, 1, MSG_PEEK);
    if (n == 0 || (n < 0 && errno != EAGAIN && errno != EINTR)) return -1;
    if (n < 0) return 0;
    int tls = first == TLS_RECORD_HANDSHAKE;
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0) return -1;
    c->fd[SIDE_BACKEND] = fd;
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    struct sockaddr_in local = {.sin_family = AF_INET, .sin_port = 0};
    local.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof local;
    if (bind(fd, (struct sockaddr *)&local, sizeof local) < 0 ||
        getsockname(fd, (struct sockaddr *)&local, &len) < 0) return -1;
    struct sockaddr_storage client;
    socklen_t client_len = sizeof client;
    if (getpeername(c->fd[SIDE_CLIENT], (struct sockaddr *)&client, &client_len) == 0) {
        c->port = ntohs(local.sin_port);
        record_peer(p, c->port, &client);
    }
    struct sockaddr_in backend = {.sin_family = AF_INET};
    backend.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    backend.sin_port = htons((unsigned short)(tls ? p->tls_port : p->plain_port));
    if (connect(fd, (struct sockaddr *)&backend, sizeof backend) < 0 && errno != EINPROGRESS) return -1;
    pending_unlink(p, c);
    c->state = ST_CONNECTING;
    if (tls) p->accepted_tls++; else p->accepted_plain++;
    struct epoll_event ev = {.events = EPOLLOUT, .data.ptr = &c->tag[SIDE_BACKEND]};
    if (epoll_ctl(p->ep, EPOLL_CTL_ADD, fd, &ev) < 0) return -1;
    c->interest[SIDE_BACKEND] = EPOLLOUT;
    conn_watch(p, c, SIDE_CLIENT); /* nothing more from the client until the backend answers */
    return 0;
}

/* Send side s's held bytes to the other side; 0 when all went (or some stay), -1 on failure. */
static int conn_flush(struct pump_conn *c, int s) {
    while (c->held_len[s] > c->held_off[s]) {
        ssize_t n = send(c->fd[1 - s], c->held[s] + c->held_off[s], c->held_len[s] - c->held_off[s], MSG_NOSIGNAL);
        if (n < 0) return (errno == EAGAIN || errno == EINTR) ? 0 : -1;
        c->held_off[s] += (size_t)n;
    }
    free(c->held[s]);
    c->held[s] = NULL;
    c->held_off[s] = c->held_len[s] = 0;
    return 0;
}

/* Side s is readable: one read, passed on at once; what the other side cannot take now is held. */
static int conn_read(struct pump *p, struct pump_conn *c, int s) {
    ssize_t n = recv(c->fd[s], p->scratch, PUMP_SCRATCH, 0);
    if (n < 0) return (errno == EAGAIN || errno == EINTR) ? 0 : -1;
    if (n == 0) {
        c->read_done[s] = 1;
        if (c->read_done[1 - s]) return -1;
        shutdown(c->fd[1 - s], SHUT_WR);
        return 0;
    }
    ssize_t sent = send(c->fd[1 - s], p->scratch, (size_t)n, MSG_NOSIGNAL);
    if (sent < 0) {
        if (errno != EAGAIN && errno != EINTR) return -1;
        sent = 0;
    }
    if (sent < n) {
        c->held[s] = malloc((size_t)(n - sent));
        if (!c->held[s]) return -1;
        memcpy(c->held[s], p->scratch + sent, (size_t)(n - sent));
        c->held_off[s] = 0;
        c->held_len[s] = (size_t)(n - sent);
    }
    return 0;
}

static void pump_accept(struct pump *p) {
    for (int i = 0; i < 64; i++) {
        int fd = accept4(p->listen_fd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd < 0) return; /* EAGAIN, or out of descriptors: the guard and the pending timeout make room */
        struct pump_conn *c = calloc(1, sizeof *c);
        if (!c) { close(fd); return; }
        int one = 1;
        setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
        c->fd[SIDE_CLIENT] = fd;
        c->fd[SIDE_BACKEND] = -1;
        c->tag[0].conn = c->tag[1].conn = c;
        c->tag[SIDE_CLIENT].side = SIDE_CLIENT;
        c->tag[SIDE_BACKEND].side = SIDE_BACKEND;
        c->state = ST_PENDING;
        c->deadline_ms = now_ms() + p->pending_ms;
        c->interest[SIDE_CLIENT] = EPOLLIN;
        struct epoll_event ev = {.events = EPOLLIN, .data.ptr = &c->tag[SIDE_CLIENT]};
        if (epoll_ctl(p->ep, EPOLL_CTL_ADD, fd, &ev) < 0) { close(fd); free(c); continue; }
        c->prev = p->pending_tail;
        if (p->pending_tail) p->pending_tail->next = c; else p->pending_head = c;
        p->pending_tail = c;
        c->all_next = p->all;
        if (p->all) p->all->all_prev = c;
        p->all = c;
        p->live++;
    }
}

static int conn_event(struct pump *p, struct pump_conn *c, int s, uint32_t events) {
    if (c->state == ST_PENDING) return (events & (EPOLLIN | EPOLLERR | EPOLLHUP)) ? conn_route(p, c) : 0;
    if (c->state == ST_CONNECTING) {
        int err = 0;
        socklen_t len = sizeof err;
        if (getsockopt(c->fd[SIDE_BACKEND], SOL_SOCKET, SO_ERROR, &err, &len) < 0 || err) return -1;
        c->state = ST_OPEN;
        conn_watch(p, c, SIDE_CLIENT);
        conn_watch(p, c, SIDE_BACKEND);
        return 0;
    }
    if ((events & EPOLLOUT) && c->held[1 - s] && conn_flush(c, 1 - s) < 0) return -1;
    if (events & EPOLLIN) {
        if (conn_read(p, c, s) < 0) return -1;
    } else if (events & (EPOLLERR | EPOLLHUP)) {
        return -1;
    }
    conn_watch(p, c, s);
    conn_watch(p, c, 1 - s);
    return 0;
}

static PyObject *demux_pump(PyObject *self, PyObject *args) {
    struct pump p = {0};
    Py_buffer peers;
    if (!PyArg_ParseTuple(args, "iiiiLw*", &p.listen_fd, &p.control_fd, &p.plain_port, &p.tls_port, &p.pending_ms,
                          &peers))
        return NULL;
    p.peers = peers.buf;
    p.peers_len = peers.len;
    p.scratch = malloc(PUMP_SCRATCH);
    p.ep = epoll_create1(EPOLL_CLOEXEC);
    if (!p.scratch || p.ep < 0) {
        free(p.scratch);
        if (p.ep >= 0) close(p.ep);
        PyBuffer_Release(&peers);
        return PyErr_SetFromErrno(PyExc_OSError);
    }
    static int listen_tag, control_tag;
    struct epoll_event ev = {.events = EPOLLIN, .data.ptr = &listen_tag};
    int failed = epoll_ctl(p.ep, EPOLL_CTL_ADD, p.listen_fd, &ev) < 0;
    ev.data.ptr = &control_tag;
    failed = failed || epoll_ctl(p.ep, EPOLL_CTL_ADD, p.control_fd, &ev) < 0;
    if (failed) {
        PyErr_SetFromErrno(PyExc_OSError);
        close(p.ep);
        free(p.scratch);
        PyBuffer_Release(&peers);
        return NULL;
    }
    struct epoll_event events[256];
    int running = 1;
    Py_BEGIN_ALLOW_THREADS
    while (running) {
        int timeout = -1;
        if (p.pending_head) {
            long long left = p.pending_head->deadline_ms - now_ms();
            timeout = left < 0 ? 0 : (int)(left > 60000 ? 60000 : left);
        }
        int n = epoll_wait(p.ep, events, 256, timeout);
        if (n < 0 && errno != EINTR) break;
        /* A connection closed by one event may still be named by a later event of this batch: closes wait. */
        struct pump_conn *closing[512];
        int nclosing = 0;
        for (int i = 0; i < n; i++) {
            void *tag = events[i].data.ptr;
            if (tag == &listen_tag) { pump_accept(&p); continue; }
            if (tag == &control_tag) {
                char cmd = 0;
                if (read(p.control_fd, &cmd, 1) <= 0 || cmd == 'q') running = 0;
                else if (cmd == 'a') epoll_ctl(p.ep, EPOLL_CTL_DEL, p.listen_fd, NULL);
                continue;
            }
            struct pump_tag *t = tag;
            struct pump_conn *c = t->conn;
            if (c->closing) continue;
            if (conn_event(&p, c, t->side, events[i].events) < 0) {
                c->closing = 1;
                closing[nclosing++] = c;
            }
        }
        for (int i = 0; i < nclosing; i++) conn_close(&p, closing[i]);
        long long now = now_ms();
        while (p.pending_head && p.pending_head->deadline_ms <= now) conn_close(&p, p.pending_head);
    }
    while (p.all) conn_close(&p, p.all);
    Py_END_ALLOW_THREADS
    close(p.ep);
    free(p.scratch);
    PyBuffer_Release(&peers);
    return Py_BuildValue("KK", p.accepted_tls, p.accepted_plain);
}

static PyMethodDef methods[] = {
    {"java_string_hash", java_string_hash, METH_O, "Java's String.hashCode (signed 32-bit)."},
    {"index_key_hash", index_key_hash, METH_O, "IndexFile.indexKeyHashMethod: abs(String.hashCode), 0 for MIN_VALUE."},
    {"encode_records", encode_records, METH_VARARGS, "codec.encode_records_py, compiled."},
    {"place_records", place_records, METH_VARARGS, "codec.place_records_py, compiled."},
    {"walk_records", walk_records, METH_VARARGS, "decode.walk_records_py, compiled."},
    {"put_message_keys", put_message_keys, METH_VARARGS, "index_file.put_message_keys_py, compiled."},
    {"demux_pump", demux_pump, METH_VARARGS,
     "tls_demux.pump_py, compiled: (listen_fd, control_fd, plain_port, tls_port, pending_ms, peers) ->\n"
     "(tls connections, plaintext connections), run off the GIL until the control pipe says 'q'."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "rocketstore.storage._hotloops",
                                    "The store's per-message hot loops, compiled (see rocketstore/storage/_speedups.py).",
                                    -1, methods, NULL, NULL, NULL, NULL};

#define INTERN(var, text) if ((var = PyUnicode_InternFromString(text)) == NULL) return NULL

PyMODINIT_FUNC PyInit__hotloops(void) {
    INTERN(str_topic, "topic");
    INTERN(str_body, "body");
    INTERN(str_properties_text, "properties_text");
    INTERN(str_properties, "properties");
    INTERN(str_born_host, "born_host");
    INTERN(str_sys_flag, "sys_flag");
    INTERN(str_queue_id, "queue_id");
    INTERN(str_flag, "flag");
    INTERN(str_born_timestamp, "born_timestamp");
    INTERN(str_reconsume_times, "reconsume_times");
    INTERN(str_prepared_transaction_offset, "prepared_transaction_offset");
    INTERN(str_default_host, "127.0.0.1:0");
    INTERN(str_schedule_topic, "SCHEDULE_TOPIC_XXXX");
    INTERN(str_tags, "TAGS\x01");
    INTERN(str_keys, "KEYS\x01");
    INTERN(str_uniq_key, "UNIQ_KEY\x01");
    INTERN(str_sep1, "\x01");
    INTERN(str_sep2, "\x02");
    return PyModule_Create(&module);
}
