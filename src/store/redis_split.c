/*
 * redis_split.c - a request across Redis Cluster slots as one call per slot
 * and the take-back that makes it all-or-nothing again (redis_split.h).
 */
#include "store/redis_split.h"

#include <stdio.h>
#include <string.h>

#include "base/util.h"
#include "store/redis_priv.h"

struct redis_split {
	struct backend_call *parent;
	void *user;
	bool answered;
	size_t nparts, outstanding;
	struct backend_call *parts; /* nparts */
	struct rl_check *checks;    /* the parent's, grouped by slot */
	struct rl_result *out;	    /* the parts' results, same order */
	int64_t *over;		    /* a report's overdrawn, same order */
	size_t *index;		    /* grouped position -> parent's */
	size_t *first;		    /* part -> its first grouped check */

	struct backend_call *tbs; /* take-backs, ntbs */
	size_t ntbs;
	struct rl_check *tb_checks; /* their checks, at most n */
	struct rl_result *tb_out;
	char *tb_strings; /* their keys and tokens, copied */
	bool *taken;	  /* grouped check: taken back */
};

struct redis_split *
redis_split_new(struct backend_call *parent, const unsigned *slots,
    backend_done_fn part_done, void *user)
{
	struct redis_split *s;
	size_t n = parent->n, i, j, k, p;
	unsigned *seen;

	if ((s = rl_calloc(1, sizeof(*s))) == NULL)
		return NULL;
	s->parent = parent;
	s->user = user;
	s->checks = rl_calloc(n, sizeof(*s->checks));
	s->out = rl_calloc(n, sizeof(*s->out));
	s->over = rl_calloc(n, sizeof(*s->over));
	s->index = rl_calloc(n, sizeof(*s->index));
	s->first = rl_calloc(n + 1, sizeof(*s->first));
	s->parts = rl_calloc(n, sizeof(*s->parts));
	s->taken = rl_calloc(n, sizeof(*s->taken));
	seen = rl_calloc(n, sizeof(*seen));
	if (s->checks == NULL || s->out == NULL || s->over == NULL ||
	    s->index == NULL || s->first == NULL || s->parts == NULL ||
	    s->taken == NULL || seen == NULL) {
		rl_free(seen);
		redis_split_free(s);
		return NULL;
	}
	/* Slots in the order of their first check; a request has few
	 * checks, so the quadratic walk is the simple and fast one. */
	for (i = 0; i < n; i++) {
		for (j = 0; j < s->nparts; j++)
			if (seen[j] == slots[i])
				break;
		if (j == s->nparts)
			seen[s->nparts++] = slots[i];
	}
	for (p = 0, k = 0; p < s->nparts; p++) {
		s->first[p] = k;
		for (i = 0; i < n; i++) {
			if (slots[i] != seen[p])
				continue;
			s->checks[k] = parent->checks[i];
			s->index[k++] = i;
		}
	}
	s->first[s->nparts] = k;
	rl_free(seen);
	for (p = 0; p < s->nparts; p++) {
		struct backend_call *c = &s->parts[p];

		c->checks = s->checks + s->first[p];
		c->n = s->first[p + 1] - s->first[p];
		c->out = s->out + s->first[p];
		c->deadline_us = parent->deadline_us;
		redis_call(c)->caller_deadline = redis_call(parent)
						     ->caller_deadline;
		c->report = parent->report;
		c->overdrawn = s->over + s->first[p];
		c->done = part_done;
		c->arg = s;
		redis_call(c)->split = s;
	}
	s->outstanding = s->nparts;
	return s;
}

void
redis_split_free(struct redis_split *s)
{
	if (s == NULL)
		return;
	rl_free(s->checks);
	rl_free(s->out);
	rl_free(s->over);
	rl_free(s->index);
	rl_free(s->first);
	rl_free(s->parts);
	rl_free(s->taken);
	rl_free(s->tbs);
	rl_free(s->tb_checks);
	rl_free(s->tb_out);
	rl_free(s->tb_strings);
	rl_free(s);
}

struct redis_split *
redis_split_of(struct backend_call *call)
{
	return redis_call(call)->split;
}

size_t
redis_split_nparts(const struct redis_split *s)
{
	return s->nparts;
}

struct backend_call *
redis_split_part(struct redis_split *s, size_t i)
{
	return &s->parts[i];
}

struct backend_call *
redis_split_parent(const struct redis_split *s)
{
	return s->parent;
}

void *
redis_split_user(const struct redis_split *s)
{
	return s->user;
}

bool
redis_split_answered(const struct redis_split *s)
{
	return s->answered;
}

bool
redis_split_one_done(struct redis_split *s)
{
	return --s->outstanding == 0;
}

bool
redis_split_allowed(const struct redis_split *s)
{
	size_t p;

	for (p = 0; p < s->nparts; p++)
		if (s->parts[p].rc != 0 || !s->parts[p].all_allowed)
			return false;
	return true;
}

int
redis_split_takebacks(struct redis_split *s, backend_done_fn tb_done,
    int64_t deadline_us)
{
	size_t n = s->first[s->nparts], p, k, m = 0, bytes = 0;
	char *sp;

	if (redis_split_allowed(s))
		return 0;
	/* The take-backs may outlive the request (answered at its deadline
	 * while they are out), and with it the keys and tokens its checks
	 * borrow: they get copies of their own. */
	for (k = 0; k < n; k++)
		bytes += s->checks[k].keylen + 1 +
		    (s->checks[k].token != NULL ?
			    strlen(s->checks[k].token) + 1 :
			    0);
	s->tbs = rl_calloc(s->nparts, sizeof(*s->tbs));
	s->tb_checks = rl_calloc(n, sizeof(*s->tb_checks));
	s->tb_out = rl_calloc(n, sizeof(*s->tb_out));
	s->tb_strings = rl_malloc(bytes);
	if (s->tbs == NULL || s->tb_checks == NULL || s->tb_out == NULL ||
	    s->tb_strings == NULL)
		return -1;
	sp = s->tb_strings;
	for (p = 0; p < s->nparts; p++) {
		struct backend_call *part = &s->parts[p], *tb;
		size_t start = m;

		/* A part that allowed recorded the cost of each check that
		 * allowed (shadow ones too); a part that denied or failed
		 * recorded nothing that is known. */
		if (part->rc != 0 || !part->all_allowed)
			continue;
		for (k = 0; k < part->n; k++) {
			if (!part->out[k].allowed || part->checks[k].cost == 0)
				continue;
			s->tb_checks[m] = part->checks[k];
			memcpy(sp, part->checks[k].key, part->checks[k].keylen);
			sp[part->checks[k].keylen] = '\0';
			s->tb_checks[m].key = sp;
			sp += part->checks[k].keylen + 1;
			if (part->checks[k].token != NULL) {
				size_t tl = strlen(part->checks[k].token) + 1;

				memcpy(sp, part->checks[k].token, tl);
				s->tb_checks[m].token = sp;
				sp += tl;
			}
			/* A chunk recorded its k units (docs/algorithms.md,
			 * "Taking quota in advance"): those go back. */
			if (part->out[k].taken > 0)
				s->tb_checks[m].cost = part->out[k].taken;
			s->tb_out[m] = part->out[k]; /* the mark */
			s->taken[s->first[p] + k] = true;
			m++;
		}
		if (m == start)
			continue;
		tb = &s->tbs[s->ntbs++];
		tb->checks = s->tb_checks + start;
		tb->n = m - start;
		tb->out = s->tb_out + start;
		tb->deadline_us = deadline_us;
		tb->done = tb_done;
		tb->arg = s;
		redis_call(tb)->split = s;
	}
	s->outstanding = s->ntbs;
	return (int)s->ntbs;
}

struct backend_call *
redis_split_takeback(struct redis_split *s, size_t i)
{
	return &s->tbs[i];
}

void
redis_split_answer(struct redis_split *s)
{
	struct backend_call *parent = s->parent;
	bool denied = false;
	size_t p, g;

	s->answered = true;
	parent->rc = 0;
	parent->kind = BACKEND_ERR_NONE;
	parent->err[0] = '\0';
	/* A part that denied decides the request, whatever another part's
	 * failure: the failure policy is for a request the store could not
	 * decide, and this one is known to be over a limit. */
	for (p = 0; p < s->nparts; p++)
		if (s->parts[p].rc == 0 && !s->parts[p].all_allowed)
			denied = true;
	for (p = 0; p < s->nparts && !denied; p++) {
		if (s->parts[p].rc == 0)
			continue;
		parent->rc = -1;
		parent->kind = s->parts[p].kind;
		memcpy(parent->err, s->parts[p].err, sizeof(parent->err));
		break;
	}
	parent->all_allowed = parent->rc == 0 && redis_split_allowed(s);
	for (g = 0; g < s->first[s->nparts]; g++) {
		struct rl_result *r = &parent->out[s->index[g]];

		*r = s->out[g];
		if (parent->overdrawn != NULL)
			parent->overdrawn[s->index[g]] = s->over[g];
		if (s->taken[g]) {
			/* Its units went back: as if never recorded. */
			r->remaining += r->taken > 0 ? r->taken :
						       s->checks[g].cost;
			r->taken = r->taken_us = 0;
			if (r->remaining > s->checks[g].limit)
				r->remaining = s->checks[g].limit;
		}
		r->mark = 0;
	}
}
