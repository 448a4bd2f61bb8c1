/*
 * config_slot.c - the published config snapshot (see config_slot.h).
 */
#include "core/config_slot.h"

void
config_slot_init(struct config_slot *s, struct config *cfg)
{
	pthread_mutex_init(&s->lock, NULL);
	s->cfg = config_ref(cfg);
}

void
config_slot_set(struct config_slot *s, struct config *cfg)
{
	struct config *old;

	config_ref(cfg);
	pthread_mutex_lock(&s->lock);
	old = s->cfg;
	s->cfg = cfg;
	pthread_mutex_unlock(&s->lock);
	config_unref(old);
}

struct config *
config_slot_get(struct config_slot *s)
{
	struct config *c;

	pthread_mutex_lock(&s->lock);
	c = config_ref(s->cfg);
	pthread_mutex_unlock(&s->lock);
	return c;
}

void
config_slot_destroy(struct config_slot *s)
{
	config_unref(s->cfg);
	s->cfg = NULL;
	pthread_mutex_destroy(&s->lock);
}
