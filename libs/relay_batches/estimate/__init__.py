"""The estimate before submit (``POST /v1/batches/estimate``): rows and tokens counted
from the requests (:mod:`.tally`), priced in each lane an alias offers and by the plan
Relay would choose (:mod:`.pricing`)."""
