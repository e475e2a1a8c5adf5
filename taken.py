from scenarios.spec import Broker, ClientSpec, Expect, Proxy, Scenario
SCENARIO = Scenario(name="x", story="s", broker=Broker(topics={"t": 1}), proxies=[Proxy("rec", listen="127.0.0.1:")], clients=[ClientSpec("p", topics=["t"], count=5, rate=20, duration_s=3)], expect=[Expect("client_inventory")])
